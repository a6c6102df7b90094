"""Imports the built-in parsers so that they register (``hermes``, ``llama3_json``, ``mistral``,
``openai``, ``pythonic``)."""

import kvserve.tool_parsers.gpt_oss  # noqa: F401
import kvserve.tool_parsers.hermes  # noqa: F401
import kvserve.tool_parsers.llama3_json  # noqa: F401
import kvserve.tool_parsers.mistral  # noqa: F401
import kvserve.tool_parsers.pythonic  # noqa: F401
