"""The web dashboard at ``/ui``: server-rendered pages over the API's store."""

from __future__ import annotations

from starlette.routing import Mount

from deadman.api.ui.routes import ROUTES

#: What create_app mounts.
MOUNT = Mount("/ui", routes=ROUTES)
