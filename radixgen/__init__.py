"""radixgen: a structured-generation LLM serving runtime."""
