"""The ends of the one copy (imgtool/pipeline): each place an image lives as a source, a destination, or both.

One module per end and direction: `registry_source` (a registry and its mirrors, through the cache), `bundle_dest`
(a bundle directory written), `bundle_source` (a bundle read in place), `registry_dest` (a registry pushed to),
`docker_source` (the local Docker's `docker save`, through the cache), `runtime_dest` (Docker, containerd or
Podman, loaded). The verbs are pairs of them: fetch = registry → bundle, export = Docker → bundle,
push = bundle → registry, load = bundle → runtime; copy = every source with every destination (copying.PAIRS).
"""
