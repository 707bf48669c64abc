"""``/docs`` (Swagger UI) and ``/redoc``, with everything they load served by
Yoke itself, so that they work offline.

The scripts and styles are those the ``fastapi-offline`` package ships (a
maintained copy of swagger-ui-dist 5 and ReDoc 2, made for this), served
from ``/docs/assets``; the pages are FastAPI's own, pointed there. A
Content-Security-Policy keeps the pages to this server: ReDoc always shows
a Redocly logo from its CDN, which the browser then does not fetch (the logo
hides itself), and nothing on either page can call another host.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
SWAGGER_JS = "swagger-ui-bundle.js"
SWAGGER_CSS = "swagger-ui.css"
REDOC_JS = "redoc.standalone.js"
FAVICON = "favicon.png"

SWAGGER_UI_PARAMETERS = {
    "validatorUrl": None,  # no validity badge from swagger.io
    "displayRequestDuration": True,
}
# Inline scripts and styles: the pages' own start-up script, and the styles
# both UIs set from script. Blobs: ReDoc's search worker.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self';"
    " frame-ancestors 'self'; base-uri 'self'; form-action 'self'"
)


def check_assets() -> None:
    missing = [f for f in (SWAGGER_JS, SWAGGER_CSS, REDOC_JS, FAVICON) if not (ASSETS_DIR / f).is_file()]
    if missing:
        raise RuntimeError(f"fastapi-offline does not ship {', '.join(missing)} in {ASSETS_DIR}: reinstall it")


def install(app: FastAPI) -> None:
    """Serve /docs, /redoc and /docs/assets on ``app`` (created with
    ``docs_url=None, redoc_url=None``)."""
    check_assets()
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            swagger_js_url=f"{root}{ASSETS_URL}/{SWAGGER_JS}",
            swagger_css_url=f"{root}{ASSETS_URL}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{root}{ASSETS_URL}/{FAVICON}",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )
        return secured(page)

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            redoc_js_url=f"{root}{ASSETS_URL}/{REDOC_JS}",
            redoc_favicon_url=f"{root}{ASSETS_URL}/{FAVICON}",
            with_google_fonts=False,
        )
        return secured(page)

    app.add_api_route("/docs", swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc, methods=["GET"], include_in_schema=False)


def secured(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page
