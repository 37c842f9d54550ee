"""The YAML configs, installed as the package data `hybridflow.configs`."""
