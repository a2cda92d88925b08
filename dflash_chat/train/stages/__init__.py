"""The demo pair's training stages, a module per group: prepare.py (corpus, tokenizer, target), drafters.py
(the DFlash and DFlash2 drafters), finetune.py (finetune, calibrate) and ship.py; answers.py holds the
target's answers the drafter stages share.

Each stage reads what the one before it wrote in a work folder, so a stage can run again alone
(or on another machine). Everything is seeded; step counts are printed so a run can be repeated.
"""
