"""Model definitions that ship with hybridflow: ``tiny``, the small offline causal LM and character
tokenizer that the tests, the quickstart and the benchmarks build and save as a Hugging Face folder."""
