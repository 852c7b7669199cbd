"""How Serve hands requests to the routers of ``serve --ray``: to a router on the proxy's own
node, while one lives there (imported by Serve's proxies, and only where Ray is installed)."""

from __future__ import annotations

from ray.serve.request_router import LocalityMixin, PendingRequest, RequestRouter, RunningReplica


class OwnNodeRouters(LocalityMixin, RequestRouter):
    """Every try of a request goes to a router on the caller's node; to any router only where
    that node holds none.

    Serve's own request router tries the caller's node once and then every node: on a loaded
    host a router that answers Serve's queue-length probe late sends the request to a router on
    another node, and if that node dies the request is lost (Serve answers 500). A router lost
    with its node then only ever held requests that entered that node's own proxy.
    """

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        own = [r for r in candidate_replicas if r.node_id == self._self_node_id]
        if pending_request is not None:
            # Serve tries again without a pause unless told to back off.
            pending_request.routing_context.should_backoff = True
        return [own or list(candidate_replicas)]


__all__ = ["OwnNodeRouters"]
