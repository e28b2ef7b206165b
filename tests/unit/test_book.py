"""The gateway's delivery book and per-login queues: order, two-phase ACK bookkeeping, replays."""

from gateway.server.book import DeliveryBook, NotifyQueue
from schemas.events import Acked, Deliver, Progress


def deliver(smuid: int, priority: int = 0, account: str = "bob") -> Deliver:
    return Deliver(account, smuid, "/t", f"C{smuid}", "alice", "g", 0, priority)


def drain(queue: NotifyQueue, book: DeliveryBook | None = None) -> list[int]:
    taken = []
    while (d := queue.pop()) is not None:
        taken.append(d.smuid)
        if book:
            book.acknowledged(d.account, d.smuid)
    return taken


def test_higher_priority_first_then_fifo_by_smuid():
    book = DeliveryBook()
    for smuid, priority in ((5, 0), (3, 0), (9, 2), (4, 1), (7, 2)):
        book.apply(deliver(smuid, priority))
    assert drain(book.queue_for_login("bob")) == [7, 9, 4, 3, 5]


def test_a_login_gets_what_the_account_has_not_acknowledged():
    book = DeliveryBook()
    for smuid in (1, 2, 3):
        book.apply(deliver(smuid))
    first_login = book.queue_for_login("bob")
    assert first_login.pop().smuid == 1
    book.acknowledged("bob", 1)
    assert first_login.pop().smuid == 2  # connection closes before acknowledging 2
    assert drain(book.queue_for_login("bob")) == [2, 3]


def test_every_login_of_an_account_gets_its_own_copy():
    book = DeliveryBook()
    one, two = book.queue_for_login("bob"), book.queue_for_login("bob")
    new = book.apply(deliver(1))
    one.push(new), two.push(new)
    assert drain(one, book) == [1] and drain(two, book) == [1]
    assert book.queue_for_login("bob").pop() is None


def test_replayed_delivery_of_an_acknowledged_message_is_ignored_until_the_job_confirms():
    book = DeliveryBook()
    book.apply(deliver(1))
    book.acknowledged("bob", 1)
    assert book.apply(deliver(1)) is None  # the job replayed its batch
    assert book.queue_for_login("bob").pop() is None
    book.apply(Acked("bob", 1))
    assert book.pending_count("bob") == 0


def test_duplicate_deliver_records_and_pushes_do_not_duplicate_notifications():
    book = DeliveryBook()
    assert book.apply(deliver(1)) is not None
    assert book.apply(deliver(1)) is None
    queue = book.queue_for_login("bob")
    queue.push(deliver(1))
    assert drain(queue) == [1]


def test_progress_records_the_jobs_command_offsets():
    book = DeliveryBook()
    book.apply(Progress({"0": 10}))
    book.apply(Progress({"0": 12}))
    assert book.commands_offsets == {"0": 12}


def test_a_withdrawn_delivery_is_never_notified_and_leaves_the_account_pending_set():
    """The job's Acked with a reason other than "acked" (expired, max_retries) withdraws it."""
    book = DeliveryBook()
    for smuid in (1, 2, 3):
        book.apply(deliver(smuid))
    queue = book.queue_for_login("bob")
    book.apply(Acked("bob", 2, "expired"))
    queue.discard(2)
    queue.discard(99)  # not queued: nothing happens
    assert drain(queue) == [1, 3]
    assert book.pending_count("bob") == 2


def test_a_delivery_routed_early_is_notified_once_whichever_copy_comes_first():
    """The gateway's own routing and the job's Deliver of the same message are one delivery."""
    book = DeliveryBook()
    assert book.speculate(deliver(1)) is not None
    assert book.apply(deliver(1)) is None
    assert book.apply(deliver(2)) is not None
    assert book.speculate(deliver(2)) is None
    assert drain(book.queue_for_login("bob")) == [1, 2]


def test_an_ack_of_a_message_the_job_has_not_routed_yet_keeps_its_deliver_away():
    """Read back at a gateway's start: bob acknowledged an early NOTIFY before the job routed it."""
    book = DeliveryBook()
    book.acknowledged("bob", 1)
    assert book.apply(deliver(1)) is None
    book.apply(Acked("bob", 1))
    assert book.pending_count("bob") == 0


def test_what_the_job_confirmed_lately_is_not_routed_early_again():
    """A fold lagging behind the job must not bring back a delivery the job settled."""
    book = DeliveryBook()
    book.apply(deliver(1))
    book.acknowledged("bob", 1)
    book.apply(Acked("bob", 1))
    assert book.speculate(deliver(1)) is None
    assert book.pending_count("bob") == 0


def test_the_book_knows_a_deliver_exactly_when_applying_it_would_change_nothing():
    """The deliveries tail skips decoding a Deliver the book knows; knowing must mean ignoring."""
    book = DeliveryBook()
    book.speculate(deliver(1))  # routed early: pending
    book.apply(deliver(2))
    book.acknowledged("bob", 2)  # acknowledged, not yet confirmed
    for smuid in (1, 2, 3):
        assert book.knows("bob", smuid) == (book.apply(deliver(smuid)) is None)
    assert not book.knows("alice", 1)
