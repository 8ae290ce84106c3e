"""DeepSeek-V2 model execution: config, tensor layout, kernels, stage executor, sampling."""
