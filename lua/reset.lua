-- Reset: forget a bucket, which makes it full (a missing key is a full bucket).
-- KEYS[1]  the bucket. Returns {1 if there was state to forget, else 0}.
return {redis.call('DEL', KEYS[1])}
