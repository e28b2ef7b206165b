"""``deploy.broker.free_port``: the ports the launcher, the benchmarks and the tests choose for
listeners they start later.  A port the kernel may hand to an outgoing connection in between (the
Kafka JVM and Spark open dozens while the stack starts) is a port the gateway may then fail to
bind: that is how CI once lost a launcher start (``address already in use`` on its status port)."""

import socket

from deploy.broker import ephemeral_range, free_port


def test_a_chosen_port_is_outside_the_range_outgoing_connections_take():
    low, high = ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert all(port < low or port > high for port in ports), sorted(ports)
    assert all(port >= 1024 for port in ports)


def test_a_chosen_port_can_be_listened_on():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_a_port_something_listens_on_is_never_chosen():
    low, _ = ephemeral_range()
    first = max(1024, low - 64)
    held = []
    try:  # listen on all the ports a choice can fall on but the last four
        for port in range(first, low - 4):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
                held.append(sock)
            except OSError:  # something else listens there already: just as good
                sock.close()
        chosen = {free_port(low=first) for _ in range(20)}
        assert chosen and not chosen & {sock.getsockname()[1] for sock in held}
        assert all(port < low for port in chosen), chosen
    finally:
        for sock in held:
            sock.close()


def test_the_kernel_range_is_read_from_proc(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40000, 50000)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)


def test_the_ports_of_one_start_are_never_the_same():
    """Each choice is random, so the broker's and the controller's listener once fell on one port
    (Kafka refused to start: "two listeners on the same port"); a start passes what it chose already."""
    low, _ = ephemeral_range()
    first = max(1024, low - 3)  # three ports to choose from: two of them to avoid
    avoided = {first, first + 1}
    chosen = {free_port(low=first, avoid=avoided) for _ in range(20)}
    assert not chosen & avoided, chosen

