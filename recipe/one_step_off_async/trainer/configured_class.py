"""A class a config names by its fully-qualified name, where the trainer needs a subclass of its own.

verl builds its agent-loop manager and its weight-sync manager from classes the config names
(``rollout.agent.agent_loop_manager_class``, ``rollout.checkpoint_manager_class``). The trainer needs the recipe's
class there (or a user's subclass of it): another class would run without what the recipe adds. ``recipe_subclass``
imports the named class as verl does and refuses any other, naming the key and the fix; the launch calls it before
Ray starts (``launch.check_launch``), the trainer when it builds the manager.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from verl.utils.import_utils import load_class_from_fqn

from recipe.one_step_off_async.errors import ConfigError, NotOnThisMachine


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def recipe_subclass(config: DictConfig, key: str, recipes: type, why: str) -> type:
    """The class ``key`` names, or ``recipes`` when the key is unset. Raise ``ConfigError`` for a class that is not a
    subclass of ``recipes`` (``why``: what the recipe's class does), ``NotOnThisMachine`` for a module that does not
    import here."""
    name = OmegaConf.select(config, key)
    if not name:
        return recipes
    fix = f"subclass {qualified_name(recipes)} ({why}), or unset the key"
    try:
        named = load_class_from_fqn(name, recipes.__name__)
    except (ImportError, AttributeError, ValueError) as error:
        # A module missing here may be on the cluster, like a custom_backend_module (preflight.missing_backends).
        refused = NotOnThisMachine if isinstance(error, ImportError) else ConfigError
        raise refused(f"{key}={name} does not import ({error}). Name an importable {fix}.") from error
    if not (isinstance(named, type) and issubclass(named, recipes)):
        raise ConfigError(f"{key}={name} is not a subclass of {qualified_name(recipes)}. Make it a {fix}.")
    return named
