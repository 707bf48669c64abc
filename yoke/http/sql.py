"""``/v1/sql``: one read-only SQL query across every actor instance's tables
and Yoke's records, in the token's tenant (docs/advanced/sql.md).

Reading needs ``read``, as reading an instance's state does. The route
calls the same ``runtime.sql`` as Python; ``Accept: text/csv`` answers the
rows as CSV (a header line of column names, then one line per row).
"""

from __future__ import annotations

import base64
import csv
import datetime
import io
import uuid
from decimal import Decimal
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from .auth import READ, Principal, runtime_of
from .responses import ERROR_RESPONSES, json_body, json_response
from .schemas import CatalogueQuery, CatalogueTables, SqlResult, answer, request_body
from .streams import object_body

router = APIRouter(prefix="/v1/sql", tags=["sql"], responses=ERROR_RESPONSES)


@router.post(
    "", openapi_extra=request_body(CatalogueQuery),
    responses={200: answer(SqlResult, "Columns and rows (at most max_rows)")},
    summary="A read-only SQL query across every instance's tables and Yoke's records",
)
async def query(request: Request, principal: Principal = READ) -> Response:
    body = object_body(await json_body(request), {"query", "params", "max_rows", "timeout_s"})
    options = {k: body[k] for k in ("max_rows", "timeout_s") if body.get(k) is not None}
    result = await runtime_of(request).sql(principal.tenant, body.get("query"), body.get("params"), **options)
    rows = [[json_value(v) for v in row] for row in result.rows]
    if "text/csv" in request.headers.get("accept", ""):
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(result.columns)
        writer.writerows([[csv_value(v) for v in row] for row in rows])
        headers = {"x-yoke-truncated": "true"} if result.truncated else {}
        return Response(out.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)
    return json_response({"columns": result.columns, "rows": rows, "truncated": result.truncated})


@router.get(
    "/tables", responses={200: answer(CatalogueTables, "Every table a query can name")},
    summary="The tables a query can name: actors' tables with their columns, and Yoke's",
)
async def tables(request: Request, principal: Principal = READ) -> Response:
    listed = await runtime_of(request).sql_tables(principal.tenant)
    return json_response({"tables": [
        {"schema": t.schema, "name": t.name, "columns": [{"name": c.name, "declared": c.declared} for c in t.columns]}
        for t in listed
    ]})


def json_value(value: Any) -> Any:
    """A value as JSON: a BLOB as {"$blob": base64}, times as ISO 8601 text."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$blob": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta, uuid.UUID)):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    if isinstance(value, float) and value != value:
        return None
    return value


def csv_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return "" if value is None else value
