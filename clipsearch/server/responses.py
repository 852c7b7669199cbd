"""The JSON response class of every endpoint."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse as _StarletteJSON


class JSONResponse(_StarletteJSON):
    """Starlette's JSON response, refusing NaN/Infinity (not JSON) instead of writing them."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
