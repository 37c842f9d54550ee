"""veRL's ``verl.utils.tensordict_utils``: the TensorDict batch helpers of hybridflow.utils.tensordicts."""

from hybridflow.utils.tensordicts import *  # noqa: F403
from hybridflow.utils.tensordicts import __all__  # noqa: F401
