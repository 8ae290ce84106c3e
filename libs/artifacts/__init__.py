"""Stage artifacts: the safetensors layout, the stage manifest and its verification.

Shared by the artifact builder (which writes artifacts) and the stage worker (which refuses
any artifact that does not verify before loading it).
"""
