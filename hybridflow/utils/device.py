"""veRL's ``verl.utils.device``: the accelerator helpers of hybridflow.utils.accelerator."""

from hybridflow.utils.accelerator import *  # noqa: F403
from hybridflow.utils.accelerator import __all__  # noqa: F401
