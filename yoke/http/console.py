"""The web console at ``/ui``: its files and its sessions.

The console is plain ES modules and CSS shipped in the package
(``yoke/console/``): nothing to build, nothing fetched from elsewhere. It is
a client of ``/v1`` like any other; what it adds here is a browser session
(``session.py``): ``/ui/session`` exchanges a one-time code (the link
``yoke serve`` prints) or a pasted token for an ``HttpOnly``,
``SameSite=Strict`` cookie and tells the page its CSRF token, tenant and
scopes; under ``yoke serve --dev`` a console without a session is signed
in as the dev tenant, without a cookie, as the API takes requests without
a token. The pages carry a Content-Security-Policy with no inline script or
style and no other origin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from .. import errors
from ..store.contract import TokenInfo
from . import session
from .auth import DEV, runtime_of
from .responses import ERROR_RESPONSES, json_body, json_response
from .schemas import ConsoleSession, SignIn, answer, request_body
from .streams import object_body

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
ASSETS_URL = "/ui/assets"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
    " font-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix="/ui", tags=["console"], responses=ERROR_RESPONSES)


def install(app: FastAPI) -> None:
    """Serve /ui (the page), /ui/assets (its modules and styles) and /ui/session on ``app``."""
    if not (CONSOLE_DIR / "index.html").is_file():
        raise RuntimeError(f"the console's files are missing from {CONSOLE_DIR}: reinstall Yoke")
    app.state.login_codes = session.LoginCodes()
    app.mount(ASSETS_URL, StaticFiles(directory=CONSOLE_DIR), name="console-assets")

    async def redirect(request: Request) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/ui/", status_code=307)

    async def page(request: Request) -> Response:
        return FileResponse(CONSOLE_DIR / "index.html", headers=PAGE_HEADERS, media_type="text/html")

    app.add_api_route("/ui", redirect, methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/", page, methods=["GET"], include_in_schema=False)


def session_json(info: TokenInfo, token: str) -> dict[str, Any]:
    return {
        "signed_in": True, "tenant": info.tenant, "scopes": list(info.scopes), "token_id": info.token_id, "name": info.name,
        "csrf": session.csrf_of(token),
    }


def with_cookie(response: Response, request: Request, token: str) -> Response:
    response.set_cookie(
        session.COOKIE, token, httponly=True, samesite="strict", path="/",
        secure=request.url.scheme == "https",
    )
    response.headers["Cache-Control"] = "no-store"
    return response


SESSION = {200: answer(ConsoleSession, "The session: tenant, scopes, CSRF token (the cookie is set)")}


@router.post(
    "/session", openapi_extra=request_body(SignIn), responses=SESSION,
    summary="Sign the console in: a one-time code or a token for a session cookie",
)
async def sign_in(request: Request) -> Response:
    body = object_body(await json_body(request), {"code", "token"})
    runtime = runtime_of(request)
    code, token = body.get("code"), body.get("token")
    if (code is None) == (token is None):
        raise errors.InvalidInput('give {"code": ...} (from the printed link) or {"token": ...}', field="body")
    if code is not None:
        if not isinstance(code, str) or not request.app.state.login_codes.redeem(code):
            raise errors.Unauthorized(
                "this sign-in link was used already or is not from this server: sign in with a token"
            )
        # It ends: a browser that never signs out does not hold an admin token forever.
        new = await runtime.tokens.create(
            "default", ["admin"], name=session.SIGN_IN_TOKEN_NAME, expires_in_s=session.SIGN_IN_TOKEN_S
        )
        info, token = new.info, new.token
    else:
        if not isinstance(token, str) or not token:
            raise errors.InvalidInput("token must be a token's secret (yk_tok_...)", field="token")
        info = await runtime.tokens.authenticate(token)
    return with_cookie(json_response(session_json(info, token)), request, token)


def dev_session_json() -> dict[str, Any]:
    """The session of a console without one on a ``yoke serve --dev`` server:
    its requests go without a token, as the API's do, so they act as tenant
    default with every scope (auth.DEV); there is no cookie, so no CSRF token."""
    return {
        "signed_in": True, "tenant": DEV.tenant, "scopes": list(DEV.scopes), "token_id": DEV.token_id,
        "name": "dev mode", "csrf": "", "dev": True,
    }


@router.get("/session", responses=SESSION, summary="The console's session (signed_in: false without one)")
async def current(request: Request) -> Response:
    """200 either way: a console that is not signed in yet is no error. On
    a ``--dev`` server a console without a session is signed in as the dev
    tenant, as the API is, and a stale cookie (its token unknown to this
    server) is cleared: sent along, it would make every request a 401."""
    token = session.cookie_token(request.headers.get("cookie"))
    answer: dict[str, Any] = {"signed_in": False}
    if token is not None:
        try:
            answer = session_json(await runtime_of(request).tokens.authenticate(token), token)
        except errors.Unauthorized:  # revoked since
            pass
    dev = not answer["signed_in"] and getattr(request.app.state, "dev", False)
    if dev:
        answer = dev_session_json()
    response = json_response(answer, headers={"Cache-Control": "no-store"})
    if dev and token is not None:
        response.delete_cookie(session.COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.delete(
    "/session", status_code=204, response_class=Response,
    summary="Sign out: the cookie is cleared and a sign-in link's token revoked",
)
async def sign_out(request: Request) -> Response:
    token = session.credentials(request.method, request.headers, None)
    if token is not None:
        runtime = runtime_of(request)
        try:
            info = await runtime.tokens.authenticate(token)
        except errors.Unauthorized:
            info = None
        if info is not None and info.name == session.SIGN_IN_TOKEN_NAME:
            await runtime.tokens.revoke(info.tenant, info.token_id)
            request.app.state.token_cache.forget(info.token_id)
    response = Response(status_code=204)
    response.delete_cookie(session.COOKIE, path="/", httponly=True, samesite="strict")
    return response
