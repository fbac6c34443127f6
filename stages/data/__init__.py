"""Your own data: files read through Hugging Face `datasets`, tokenized once (cached by
content), memory-mapped by the workers, and recorded in lineage.

Before any worker starts, the launcher (stages.launch) resolves each configured dataset
(files.py), checks every row's keys and shape, tokenizes it with the model's tokenizer
and chat template (render.py) into an Arrow cache keyed by content (prepare.py), and
hands the workers a plan. The workers read examples by index from that cache
(examples.py); a stage with no `data.<stage>.train.path` reads the built-in tasks
through the same interface.
"""
