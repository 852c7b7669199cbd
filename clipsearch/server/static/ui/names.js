// The people of the chosen index (GET /api/people), by number, and how the UI names them.

export const peopleInfo = new Map();

export function personLabel(id) {
  const info = peopleInfo.get(id);
  return info ? info.label : `#${id}`;
}

export function peopleWords(ids) {
  const labels = ids.map(personLabel);
  return labels.length > 1 ? `${labels.slice(0, -1).join(", ")} and ${labels[labels.length - 1]}` : labels.join("");
}

// The people of a hit's faces as the UI names them (faces of nobody and hidden people left out).
export function hitPeople(result) {
  const faces = Array.isArray(result.faces) ? result.faces : [];
  return faces.filter((f) => typeof f.person === "number").map((f) => f.name || personLabel(f.person));
}
