"""The container runtimes of a host, one room each behind one interface: Docker, containerd, Podman.

`base` holds what every room reports and does (`Runtime`, `RuntimeInfo`, `ImageInfo`); `docker` (with its
stdlib transport `docker_http`), `containerd` and `podman` are the rooms; `kubelet` reads which runtime a
Kubernetes node's kubelet uses, the input of the choice among them.
"""
