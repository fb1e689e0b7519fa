"""qlower beside other projects: torchao, HF transformers, AOTInductor, tensor parallel."""
