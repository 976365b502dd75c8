# Retry throttling (A6 "Throttling Retry Attempts and Hedged RPCs"), kept in milli-tokens so that the
# 3 decimal places of maxTokens and tokenRatio are exact. One instance per server name, shared by calls.
# Every method runs with the GIL held and calls no Python code, so it is atomic for threaded drivers too.

cdef class RetryThrottle:
    def __init__(self, long max_milli_tokens, long milli_token_ratio):
        if max_milli_tokens <= 0 or milli_token_ratio <= 0:
            raise ValueError("max_milli_tokens and milli_token_ratio must be positive")
        self.max_milli_tokens = max_milli_tokens
        self.milli_token_ratio = milli_token_ratio
        self.milli_tokens = max_milli_tokens

    cpdef bint record_failure(self):
        """A failure that counts: one token less. Returns whether retries are still allowed."""
        self.milli_tokens = self.milli_tokens - 1000 if self.milli_tokens > 1000 else 0
        return self.milli_tokens * 2 > self.max_milli_tokens

    cpdef void record_success(self):
        self.milli_tokens += self.milli_token_ratio
        if self.milli_tokens > self.max_milli_tokens:
            self.milli_tokens = self.max_milli_tokens

    cpdef bint allows_retry(self):
        return self.milli_tokens * 2 > self.max_milli_tokens

    @property
    def tokens(self):
        return self.milli_tokens / 1000.0
