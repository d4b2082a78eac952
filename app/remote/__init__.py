"""The remote engine source (`inferlab --attach URL`): an OpenAI-compatible server watched through bounded
reads of its /metrics scrape and streamed (SSE) requests; it declares what it cannot show."""
