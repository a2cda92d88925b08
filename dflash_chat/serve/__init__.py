"""`dflash-chat serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

requests.py   request bodies read and checked (OpenAI-shaped errors for what is wrong)
errors.py     the error type and its JSON
queue.py      one answer at a time on the engine; the rest wait in a bounded queue
responses.py  completion objects, stream chunks, usage and the DFlash figures
metrics.py    Prometheus metrics under vLLM's names
app.py        the routes
server.py     loading the model (through runtime/loader.py) and running uvicorn
"""
