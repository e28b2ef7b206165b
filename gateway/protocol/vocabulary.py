"""The command language: verbs and their handlers' names, and the keyword sets the handlers
accept (abbreviations included, spec section 4).
"""

from __future__ import annotations

import re
from types import MappingProxyType


VERBS = MappingProxyType({
    "LOGIN": "LOGIN",
    "PASS": "PASS", "PASSWORD": "PASS",
    "COUNT": "COUNT",
    "LIST": "LIST",
    "CREATE": "CREATE",
    "REMOVE": "REMOVE", "REM": "REMOVE",
    "SET": "SET",
    "FIND": "FIND",
    "PUB": "PUBLISH", "PUBLISH": "PUBLISH",
    "SUB": "SUBSCRIBE", "SUBSCRIBE": "SUBSCRIBE",
    "UNSUB": "UNSUBSCRIBE", "UNSUBSCRIBE": "UNSUBSCRIBE",
    "GET": "GET",
    "310": "ACK",
    "CONNECTTO": "CONNECTTO",
    "NOOP": "NOOP",
    "QUIT": "QUIT",
})

#: Verbs served before login.  PUBLISH answers 401 itself, after its body.
OPEN_VERBS = frozenset({"LOGIN", "PASS", "PASSWORD", "NOOP", "QUIT", "PUB", "PUBLISH"})

MESSAGE_WORDS = frozenset({"MESSAGE", "MESS", "MESSAGES"})
TOPIC_WORDS = frozenset({"TOPIC", "TOPICS"})
#: The UAL rights that reach a virtual topic's target's messages, so are checked on the target too.
THROUGH_LINKS = frozenset({"subscribe", "publish", "reply"})
SUBSCRIBER_WORDS = frozenset({"SUBSCRIBERS", "SUBSCRIBER", "SUB"})
SERVER_WORDS = frozenset({"SERVER", "SERV"})
PUBLISH_RESOURCES = MESSAGE_WORDS | {"REPLY"}
PROFILE_FIELDS = MappingProxyType({"NAME": "name", "EMAIL": "email", "ADDRESS": "address", "PHONE": "phone"})
#: CREATE TOPIC's 405 "topic link bad" for a link to an account topic (4.1.4: the server disallows
#: topics by the path of an account's reply topic; a link would be another way in to one).
ACCOUNT_LINK = "topic link bad: an account topic is never a link target"
CREATE_ARGS = re.compile(r"^(?P<topic>\S+)(?:\s+(?P<keywords>\([^)]*\)))?(?:\s+>\s*(?P<target>\S+))?\s*$")
