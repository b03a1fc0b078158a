"""Transport code shared by the worker, the hub and the clients.

Public modules, each imported on its own so that a process loads only the
transport it uses (the hub never loads grpclib, a gRPC client never loads
httptools):

* `blockx.net.http`: the HTTP/1.1 server side (httptools) with WebSocket
  upgrades: the hub's port and the worker's metrics and status-page port.
* `blockx.net.channels`: grpclib channels driven from Trio (trio-asyncio),
  for the worker client, placement and the etcd client.
* `blockx.net.tls`: TLS contexts from certificate files, server and client.
* `blockx.net.auth`: the bearer token of the gRPC port, checked and sent.
"""
