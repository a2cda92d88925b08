"""`dflash-chat serve`: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

app.py          the routes
openai_chat.py  /v1/chat/completions and /v1/completions: bodies read, answers written in OpenAI's shape
requests.py     the internal request every dialect becomes, and the body checks they share
tools.py        the tools a request offers, checked the same way in every dialect
images.py       the images a request names: read in each dialect, decoded (or fetched) for the prompt
exchange.py     one request's exchange: body limits, queue, answer, written back whole or streamed
writer.py       what a dialect's writer does; server-sent events
served.py       what is served: the model, its name, the queue, the rules; the engine thread's side
scheduler.py    one answer at a time on the engine; the rest wait in a bounded queue
guard.py        Host, Origin and Content-Type checked before any route runs
errors.py       the error type and its JSON
metrics.py      Prometheus metrics under vLLM's names
server.py       loading the model (through runtime/loader.py) and running uvicorn
"""

MAX_BODY = 32 * 1024 * 1024  # bytes of a request body; a long chat is far smaller, images sent inline (base64) are not
