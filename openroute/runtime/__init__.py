"""The runtime's helpers beside the engine (``openroute.engine``): the server's log (``logs.py``), traces across
the asynchronous hops (``tracing.py``), the retention job (``retention.py``), the size above which a bulk action
goes to Spark (``bulk.py``) and the garbage collector's settings while a node serves (``collector.py``). They
import the definitions and the store, never an edge.
"""
