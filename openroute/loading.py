"""Finding the application ``openroute run`` serves: import ``module:attribute`` (from the current directory too,
as uvicorn does) and read its routes, bindings, mounts and notes.

    from openroute.loading import load_application
    loaded = load_application("myapp:app")      # myapp.py in the current directory
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from openroute.definitions.errors import ConfigurationError, DeploymentError
from openroute.definitions.route import RouteRegistry
from openroute.dsl import Application, checked_mounts
from openroute.inbound import InboundBinding

__all__ = ["DEFAULT_ROUTES", "checked_mounts", "load_application", "load_routes", "routes_and_bindings"]

#: what ``openroute run`` serves without ``--routes``: the reference application
DEFAULT_ROUTES = "openroute_reference:registry"


def load_application(spec: str) -> Application:
    """Import ``module:attr`` and return what it serves as an :class:`~openroute.dsl.Application`: an Application
    as it is; a RouteRegistry, an object with ``routes`` and ``bindings`` (and optional ``mounts`` and ``notes``),
    or a callable returning one of these, wrapped with :meth:`Application.of <openroute.dsl.Application.of>`.

    The current directory is searched first, as uvicorn does, so ``openroute run --routes myapp:app`` finds
    ``./myapp.py``. Raises ConfigurationError (one line: the module, the attribute, or what went wrong while
    importing, with the file and line) and the application's own DeploymentError.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--routes must be 'module:attribute', got {spec!r}")
    module = _import(module_name)
    try:
        target: Any = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if callable(target) and not isinstance(target, RouteRegistry):
        try:
            target = target()
        except (ConfigurationError, DeploymentError):
            raise
        except Exception as error:
            raise ConfigurationError(f"{spec}() failed{_where(error)}: {type(error).__name__}: {error}") from None
    if isinstance(target, Application):
        return target
    registry, bindings = routes_and_bindings(target, spec)
    mounts = checked_mounts(getattr(target, "mounts", None) or ())
    notes = getattr(target, "notes", None) or ()
    if isinstance(notes, str) or not all(isinstance(note, str) for note in notes):
        raise ConfigurationError(f"{spec}: notes must be a list of strings")
    return Application.of(registry, bindings, mounts=mounts, notes=notes)


def _import(module_name: str) -> Any:
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and module_name.startswith(error.name):
            raise ConfigurationError(
                f"cannot import routes module {module_name!r}: no module named {error.name!r} "
                f"(looked in {here} and the installed packages)") from None
        raise ConfigurationError(f"cannot import routes module {module_name!r}: {error}") from None
    except ImportError as error:
        raise ConfigurationError(f"cannot import routes module {module_name!r}: {error}") from None
    except (ConfigurationError, DeploymentError):  # the application's own checks: every problem, listed
        raise
    except Exception as error:
        raise ConfigurationError(
            f"importing routes module {module_name!r} failed{_where(error)}: {type(error).__name__}: {error}"
        ) from None


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def load_routes(spec: str) -> tuple[RouteRegistry, list[InboundBinding] | None]:
    """Import ``module:attr`` and return its routes and bindings (see :func:`load_application`)."""
    loaded = load_application(spec)
    return loaded.routes, loaded.bindings


def routes_and_bindings(target: Any, what: str) -> tuple[RouteRegistry, list[InboundBinding] | None]:
    """The routes and bindings of ``target``: a :class:`RouteRegistry` (bindings None: the defaults), an object
    with ``routes`` and ``bindings`` (an ``openroute.dsl.Application``), or a callable returning either."""
    if callable(target) and not isinstance(target, RouteRegistry):
        target = target()
    if isinstance(target, RouteRegistry):
        return target, None
    routes = getattr(target, "routes", None)
    bindings = getattr(target, "bindings", None)
    if isinstance(routes, RouteRegistry):
        if bindings is not None and not all(isinstance(b, InboundBinding) for b in bindings):
            raise ConfigurationError(f"{what}: bindings must be InboundBinding objects")
        return routes, None if bindings is None else list(bindings)
    raise ConfigurationError(f"{what} is neither a RouteRegistry nor an object with routes and bindings")
