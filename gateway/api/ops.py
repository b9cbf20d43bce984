"""Operations endpoints: `GET /metrics` (Prometheus) and `GET /v1/usage` (the usage ledger)."""

from __future__ import annotations

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import BadRequest
from gateway.ops.ledger import Ledger, UsageList, check_day
from gateway.ops.metrics import Metrics


@get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response[bytes]:
    # Rendering is synchronous but small (a few dozen series, one psutil read per worker).
    m: Metrics = request.app.state.metrics
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)


@get("/v1/usage")
async def usage(request: Request, since: str | None = None, model: str | None = None) -> UsageList:
    if since is not None:
        try:
            check_day(since)
        except ValueError:
            raise BadRequest(f"`since` must be a date as YYYY-MM-DD, got {since!r}") from None
    ledger: Ledger = request.app.state.ledger
    return UsageList(object="list", data=ledger.rows(since, model))


handlers = [metrics, usage]
