"""Operations endpoints: `GET /metrics` (Prometheus) and `GET /v1/usage` (the usage ledger)."""

from __future__ import annotations

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromQuery
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.errors import BadRequest
from gateway.http.services import Services
from gateway.ops.ledger import UsageList, check_day


@get("/metrics", include_in_schema=False)
async def metrics(services: NamedDependency[Services]) -> Response[bytes]:
    # Rendering is synchronous but small (a few dozen series, one psutil read per worker).
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@get("/v1/usage")
async def usage(
    services: NamedDependency[Services], since: FromQuery[str | None] = None, model: FromQuery[str | None] = None
) -> UsageList:
    if since is not None:
        try:
            check_day(since)
        except ValueError:
            raise BadRequest(f"`since` must be a date as YYYY-MM-DD, got {since!r}") from None
    return UsageList(object="list", data=services.ledger.rows(since, model))


handlers = [metrics, usage]
