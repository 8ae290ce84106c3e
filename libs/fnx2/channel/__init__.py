"""FNX2 channels on asyncio, above `libs.fnx2.wire`: the receiving end (`receiver.py`), the
sending end (`sender.py`), the framed stream with its one read path (`stream.py`), the
zero-copy transport (`transport.py`) and the limits before trust (`listener.py`).

The stage's lease and KV epoch rules come in through `session.SessionRules`; nothing here
imports the services that implement them.
"""
