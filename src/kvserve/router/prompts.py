"""The prompt's token ids at the router, as a kvserve worker computes them: ``prompt`` through
the tokenizer (``add_special_tokens`` as the request says, default true), token-id prompts as
given, chat ``messages`` through the chat template with ``add_generation_prompt``, an Anthropic
Messages body (``/v1/messages``) as the chat request it translates to. Routing uses
only the first prompt of a batch. A request the router cannot tokenize (a template error, a
content part it does not know) is routed by load: validating it is the worker's job.
"""

from __future__ import annotations

import logging
from typing import Any

from kvserve.api.anthropic_protocol import AnthropicMessagesRequest
from kvserve.api.anthropic_request import to_chat_request
from kvserve.api.protocol import tools_for_template
from kvserve.api.responses_input import chat_request as responses_chat_request
from kvserve.api.responses_input import input_messages
from kvserve.api.responses_protocol import ResponsesRequest
from kvserve.api.tokenization import render_chat, tokenize_prompt

logger = logging.getLogger(__name__)


class PromptTokenizer:
    """Args:
        tokenizer: a Hugging Face tokenizer (``kvserve.tokenizer.load_tokenizer``).
        chat_template: a template text overriding the tokenizer's, or None.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    def token_ids(self, path: str, body: dict) -> list[int] | None:
        """The first prompt's token ids, or None when it cannot be told here."""
        try:
            if path.endswith("/chat/completions"):
                return self._chat(body)
            if path.endswith("/v1/messages"):
                return self._messages(body)
            if path.endswith("/v1/responses"):
                return self._responses(body)
            return self._completion(body)
        except Exception as exc:  # noqa: BLE001 - the worker will word the error
            logger.debug("cannot tokenize a request for routing: %s", exc)
            return None

    def _completion(self, body: dict) -> list[int] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
            if isinstance(prompt, int):
                return list(body["prompt"])
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if isinstance(prompt, str):
            return tokenize_prompt(self.tokenizer, prompt, add_special_tokens=body.get("add_special_tokens", True))
        return None

    def _chat(self, body: dict) -> list[int] | None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        return render_chat(self.tokenizer, messages, add_generation_prompt=body.get("add_generation_prompt", True),
                           continue_final_message=body.get("continue_final_message", False),
                           chat_template=self.chat_template, tools=body.get("tools"),
                           chat_template_kwargs=body.get("chat_template_kwargs"))

    def _messages(self, body: dict) -> list[int] | None:
        """An Anthropic Messages body (system, messages, tools) as its chat request renders
        (without the worker's template probes and default template variables)."""
        chat = to_chat_request(AnthropicMessagesRequest.model_validate(body))
        messages = [message.to_template_dict(i) for i, message in enumerate(chat.messages)]
        return render_chat(self.tokenizer, messages, add_generation_prompt=chat.add_generation_prompt,
                           continue_final_message=chat.continue_final_message, chat_template=self.chat_template,
                           tools=tools_for_template(chat.tools), chat_template_kwargs=chat.chat_template_kwargs)

    def _responses(self, body: dict) -> list[int] | None:
        """A Responses body (instructions, input, tools) as its chat request renders; None for a
        follow-up (``previous_response_id``: its history is on the worker that stored it)."""
        request = ResponsesRequest.model_validate(body)
        if request.previous_response_id is not None:
            return None
        chat = responses_chat_request(request, input_messages(request.input))
        messages = [message.to_template_dict(i) for i, message in enumerate(chat.messages)]
        return render_chat(self.tokenizer, messages, add_generation_prompt=chat.add_generation_prompt,
                           continue_final_message=chat.continue_final_message, chat_template=self.chat_template,
                           tools=tools_for_template(chat.tools), chat_template_kwargs=chat.chat_template_kwargs)
