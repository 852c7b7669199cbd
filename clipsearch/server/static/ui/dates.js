// Dates in words: the camera's wall-clock time as ISO 8601 gives it, days for the date filters.

const ISO = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?(?:\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$/;

// The camera's own wall-clock time as a UTC Date, so formatting in UTC shows exactly what the
// camera recorded (no shift into the viewer's time zone). null when not ISO 8601.
export function wallClock(iso) {
  const m = typeof iso === "string" ? ISO.exec(iso.trim()) : null;
  if (!m) return null;
  const date = new Date(Date.UTC(+m[1], +m[2] - 1, +m[3], +(m[4] || 0), +(m[5] || 0), +(m[6] || 0)));
  return { date, hasTime: m[4] !== undefined, offset: m[7] || "" };
}

export const dayWords = new Intl.DateTimeFormat(undefined, { dateStyle: "full", timeZone: "UTC" });
const dateWords = new Intl.DateTimeFormat(undefined, { dateStyle: "long", timeZone: "UTC" });
const dateTimeWords = new Intl.DateTimeFormat(undefined, { dateStyle: "long", timeStyle: "short", timeZone: "UTC" });

export function takenWords(iso) {
  const t = wallClock(iso);
  if (!t) return iso || "";
  return (t.hasTime ? dateTimeWords : dateWords).format(t.date);
}

// A YYYY-MM-DD that is a real day (not 2023-02-30).
export function isDay(text) {
  const t = /^\d{4}-\d{2}-\d{2}$/.test(text) ? wallClock(text) : null;
  return Boolean(t) && t.date.toISOString().slice(0, 10) === text;
}

export function nextDay(day) {
  const t = wallClock(day);
  return new Date(t.date.getTime() + 86400000).toISOString().slice(0, 10);
}

export function previousDay(day) {
  const t = wallClock(day);
  return new Date(t.date.getTime() - 86400000).toISOString().slice(0, 10);
}
