"""openroute: asynchronous enterprise messaging on reactive, back-pressured channels.

See ``../shared/DESIGN.md`` (the map) and README.md (the user guide).
"""

__version__ = "0.1.0"
