"""The node's jobs beside the engine: loops every node runs in its lifespan over the shared store.

:class:`~openroute.jobs.counts.MessageCounts` folds the recent state transitions into the stored counts (and reads
them exactly for the admin API, the console and ``/metrics``); :class:`~openroute.jobs.payload_indexer.PayloadIndexer`
copies stored payloads into the payload search's index. Both belong to the running node, not to a face that shows
their results, so they sit in the runtime layer, under every edge that reads them.
"""

from openroute.jobs.counts import MessageCounts, StateCounts
from openroute.jobs.payload_indexer import PayloadIndexer

__all__ = ["MessageCounts", "PayloadIndexer", "StateCounts"]
