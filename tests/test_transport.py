"""imgtool/transport.py: the HTTP set-up the registry room and the model hubs' room share. Their waits come from one
place (`Waited`), so the same settings give the same timeouts and the same words in both rooms."""

from imgtool.hubs.http import HubHttp
from imgtool.registry import RegistryClient


def test_the_registry_and_a_hub_take_their_waits_from_one_place():
    clients = [RegistryClient("http://127.0.0.1:9", read_timeout=3.0, min_rate=500, use_docker_config=False),
               HubHttp("http://127.0.0.1:9", read_timeout=3.0, min_rate=500)]
    for client in clients:
        assert (client.timeout, client.response_timeout, client.min_rate) == ((10.0, 3.0), 6.0, 500)
        # a probe's own (connect, read): its answer within twice that read timeout, never past the endpoint's
        assert client._too_slow(client._seconds((5.0, 1.0))).message == \
            "127.0.0.1:9: answered too slowly: not complete within 2 s ($IMGTOOL_RESPONSE_TIMEOUT)"
        assert client._seconds(None) == 6.0
