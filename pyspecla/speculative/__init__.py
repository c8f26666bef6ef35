"""Speculative decoding: the draft tree's schedule (hld), the recurrent-state verify and commit
through libspecla (recurrent), and the step loop built on them."""
