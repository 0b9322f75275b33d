-- The latest pkarr packet each user gave the homeserver (signed by the user: the
-- `_pubky` record naming this homeserver), which the server republishes on the mainline
-- DHT so that the record outlives the user's own devices.
CREATE TABLE pkarr_packets (
    owner     TEXT PRIMARY KEY REFERENCES users (public_key),
    -- The packet's own timestamp (microseconds): only a newer packet replaces it.
    timestamp INTEGER NOT NULL,
    -- The packet as pkarr relays carry it: signature, timestamp, DNS packet.
    packet    BLOB NOT NULL
);
