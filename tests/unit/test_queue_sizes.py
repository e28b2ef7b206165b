"""The delivery book's per-topic queue sizes: distinct messages pending for some account, and their
data bytes, as deliveries arrive and are acknowledged (what PUBLISH's queue limits read)."""

from gateway.server.book import DeliveryBook
from schemas.events import Acked, Deliver, Section


def deliver(smuid: int, account: str, topic: str = "/t", size: int = 10) -> Deliver:
    section = Section([("Content-Type", "text/plain")], b"x" * size)
    return Deliver(account, smuid, topic, f"C{smuid}", "alice", "g", 0, 0, [], [section])


def test_a_message_counts_once_however_many_accounts_wait_for_it():
    book = DeliveryBook()
    for event in (deliver(1, "bob"), deliver(1, "ann"), deliver(2, "bob", size=5), deliver(3, "bob", "/u")):
        book.apply(event)
    book.apply(deliver(1, "bob"))  # a replayed record changes nothing
    assert book.sizes.of("/t") == (2, 15) and book.sizes.of("/u") == (1, 10) and book.sizes.of("/v") == (0, 0)
    book.acknowledged("bob", 1)  # ann still waits for it
    assert book.sizes.of("/t") == (2, 15)
    book.apply(Acked("ann", 1))  # the job confirms (or expires) ann's copy: nobody waits any more
    assert book.sizes.of("/t") == (1, 5)
    book.apply(Acked("bob", 1))  # bob's confirmation of what he acknowledged already
    book.acknowledged("bob", 2)
    book.apply(Acked("bob", 2))
    assert book.sizes.of("/t") == (0, 0) and book.sizes.of("/u") == (1, 10)


def test_an_acknowledged_message_replayed_by_the_job_is_not_counted_again():
    book = DeliveryBook()
    book.apply(deliver(7, "bob"))
    book.acknowledged("bob", 7)
    book.apply(deliver(7, "bob"))  # job restart replays the batch before its Acked
    assert book.sizes.of("/t") == (0, 0)
