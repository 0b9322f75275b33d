--
-- PostgreSQL database dump
--

\restrict 9aMrx5pW1X5hMUckDRz5suntY6kRn5TUolcGIQG0pIpaNLyr25YMAdaKYM5OXBO

-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: _sqlx_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public._sqlx_migrations (
    version bigint NOT NULL,
    description text NOT NULL,
    installed_on timestamp with time zone DEFAULT now() NOT NULL,
    success boolean NOT NULL,
    checksum bytea NOT NULL,
    execution_time bigint NOT NULL
);


--
-- Name: entries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.entries (
    owner text NOT NULL COLLATE pg_catalog."C",
    path text NOT NULL COLLATE pg_catalog."C",
    blob_key text NOT NULL COLLATE pg_catalog."C",
    size bigint NOT NULL,
    content_hash bytea NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);


--
-- Name: events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.events (
    cursor bigint NOT NULL,
    owner text NOT NULL COLLATE pg_catalog."C",
    path text NOT NULL COLLATE pg_catalog."C",
    kind text NOT NULL,
    content_hash bytea,
    created_at bigint NOT NULL,
    CONSTRAINT events_kind_check CHECK ((kind = ANY (ARRAY['PUT'::text, 'DEL'::text])))
);


--
-- Name: events_cursor_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.events ALTER COLUMN cursor ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.events_cursor_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: leases; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.leases (
    name text NOT NULL,
    holder text NOT NULL,
    expires_at bigint NOT NULL
);


--
-- Name: pkarr_packets; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.pkarr_packets (
    owner text NOT NULL COLLATE pg_catalog."C",
    "timestamp" bigint NOT NULL,
    packet bytea NOT NULL
);


--
-- Name: retired_blobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.retired_blobs (
    blob_key text NOT NULL COLLATE pg_catalog."C",
    retired_at bigint NOT NULL
);


--
-- Name: seen_signatures; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.seen_signatures (
    signature_id bytea NOT NULL,
    expires_at bigint NOT NULL
);


--
-- Name: sessions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sessions (
    token_hash bytea NOT NULL,
    owner text NOT NULL COLLATE pg_catalog."C",
    capabilities text NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);


--
-- Name: signup_tokens; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.signup_tokens (
    token text NOT NULL COLLATE pg_catalog."C",
    created_at bigint NOT NULL,
    used_by text,
    used_at bigint
);


--
-- Name: users; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.users (
    public_key text NOT NULL COLLATE pg_catalog."C",
    created_at bigint NOT NULL,
    used_bytes bigint DEFAULT 0 NOT NULL,
    quota_bytes bigint,
    disabled boolean DEFAULT false NOT NULL,
    last_activity bigint NOT NULL,
    signup_token text,
    CONSTRAINT users_used_bytes_check CHECK ((used_bytes >= 0))
);


--
-- Data for Name: _sqlx_migrations; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public._sqlx_migrations (version, description, installed_on, success, checksum, execution_time) FROM stdin;
1	init	2026-11-28 14:41:03.399157+00	t	\\x42a10d73a3c896bc12407a9cbfe98ce0a2c5cef02218e794524b3337b4f6a0df5414e09a4f6760e07bbb85124bf5a13f	56122060
2	pkarr packets	2026-11-28 14:41:03.459787+00	t	\\x47ba48a9cf9d7c9d2c3701ce3e8a7e6fb897b37956c00e271f68c75f817238f03709bc6c8218e53ee0cd642d87628edf	8057429
3	retired blobs	2026-11-28 14:41:03.470362+00	t	\\x1df2fb481b1cea6dc1a7fc5f837d0c968b3fc26dc5b33af328bb40773eb527855c11a540d6e8d55ad958a30f05a4e7c2	25568348
\.


--
-- Data for Name: entries; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.entries (owner, path, blob_key, size, content_hash, created_at, updated_at) FROM stdin;
7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/0.txt	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo/01a2229a-3cb3-7720-9130-c21697e65269	39	\\x2b2ae7f5d4e9ab0cac573f8eec3d01e67f9a5e6f65ee430b755f42190ae46b15	1795876862	1795876863
7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/1.txt	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo/01a2229a-3b79-7047-b3ae-6f689d439eac	1280	\\x1b062fff9383f432db5c2b5e99aeee356a86777a2dda442ea87a70df59da90de	1795876862	1795876862
7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/2.txt	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo/01a2229a-3bca-76d3-947f-65ab08590cff	1920	\\xdab01c5f8b1265b4f76765a26cd4de24252b283372d6a87bb09ec4cd52ecb7d1	1795876862	1795876862
7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/3.txt	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo/01a2229a-3c16-74f0-a2c9-e927b2c704c6	2560	\\x286cea7e67dec47225e0d28f9ad6b8c7dfb7bb83e58c4fe5429df93275dcd4d3	1795876863	1795876863
orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/0.txt	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky/01a2229a-3aad-731c-8c8f-9176d0277df7	39	\\xcdfd829c6927bbba429b8b5b7ec524d484b49e2ce42689d8d822eb3e7ba499c4	1795876862	1795876862
orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/1.txt	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky/01a2229a-39f7-752d-a759-d6feb13dc006	1280	\\x51cb26bb434413b4d29c7027adc7dd22327816c1c60340073addbc7d0c3db106	1795876862	1795876862
orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/2.txt	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky/01a2229a-3a24-74a1-9460-37e68d3856f2	1920	\\xc6c32d55bd24654bb27195b427ab24ad1b8b988245ea2b0d835b5a884c919de5	1795876862	1795876862
orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/3.txt	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky/01a2229a-3a55-7204-8818-fc8f5e6e6ee4	2560	\\x44cd0cecf55659362d639238e06e0efedf5f5619a345f06eb6fcca5ab9ed6ee8	1795876862	1795876862
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/0.txt	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy/01a2229a-385f-71c5-b542-6049c3b49d1e	39	\\xdf26297097ff90512eeaa0a41dc0b49c0b54505310440359d4e36ea969d1c893	1795876861	1795876862
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/1.txt	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy/01a2229a-3723-70aa-a957-b4423eb15d5e	1280	\\xefb4f9057d4bea7a086b42d53e06101e624be95d142658d068d6c1f86044dfa4	1795876861	1795876861
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/2.txt	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy/01a2229a-3768-7540-9efc-c6fa7efa4f48	1920	\\xd1af2e8bf1a7990b45a55899de406fd7bab97fd80ab952a884dca43cf20c53d0	1795876861	1795876861
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/3.txt	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy/01a2229a-37b7-7278-bd19-b6bf7a9fae1b	2560	\\x74bc54ba2fbcb3ede3a54283db879b2f8060ff51c895bd3f75f4138eb19005a3	1795876861	1795876861
\.


--
-- Data for Name: events; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.events (cursor, owner, path, kind, content_hash, created_at) FROM stdin;
1	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/0.txt	PUT	\\xbee626c92abb6550dfa13d600d171d9b002fb1b733a2d816f6c2943802e083fc	1795876861
2	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/1.txt	PUT	\\xefb4f9057d4bea7a086b42d53e06101e624be95d142658d068d6c1f86044dfa4	1795876861
3	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/2.txt	PUT	\\xd1af2e8bf1a7990b45a55899de406fd7bab97fd80ab952a884dca43cf20c53d0	1795876861
4	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/3.txt	PUT	\\x74bc54ba2fbcb3ede3a54283db879b2f8060ff51c895bd3f75f4138eb19005a3	1795876861
5	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/4.txt	PUT	\\xed2bf8c852436677b0d10603cc07ea0ff0e22d10b823510103b2f9390dc18385	1795876862
6	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/0.txt	PUT	\\xdf26297097ff90512eeaa0a41dc0b49c0b54505310440359d4e36ea969d1c893	1795876862
7	tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	/pub/release/4.txt	DEL	\N	1795876862
8	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/0.txt	PUT	\\x4745a31691b893f929c15c336c5607151f89ebef89e90a6de8d0b50eb4a2e875	1795876862
9	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/1.txt	PUT	\\x51cb26bb434413b4d29c7027adc7dd22327816c1c60340073addbc7d0c3db106	1795876862
10	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/2.txt	PUT	\\xc6c32d55bd24654bb27195b427ab24ad1b8b988245ea2b0d835b5a884c919de5	1795876862
11	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/3.txt	PUT	\\x44cd0cecf55659362d639238e06e0efedf5f5619a345f06eb6fcca5ab9ed6ee8	1795876862
12	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/4.txt	PUT	\\xb4e30fa3407d4de6cbe58d6a231150db96f4288b17f2881487f72e6ffc06628a	1795876862
13	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/0.txt	PUT	\\xcdfd829c6927bbba429b8b5b7ec524d484b49e2ce42689d8d822eb3e7ba499c4	1795876862
14	orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	/pub/release/4.txt	DEL	\N	1795876862
15	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/0.txt	PUT	\\xea6a411d11bf0293fcfafc367afd7096ee0989b2f3203c10f750c281eb1e786a	1795876862
16	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/1.txt	PUT	\\x1b062fff9383f432db5c2b5e99aeee356a86777a2dda442ea87a70df59da90de	1795876862
17	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/2.txt	PUT	\\xdab01c5f8b1265b4f76765a26cd4de24252b283372d6a87bb09ec4cd52ecb7d1	1795876862
18	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/3.txt	PUT	\\x286cea7e67dec47225e0d28f9ad6b8c7dfb7bb83e58c4fe5429df93275dcd4d3	1795876863
19	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/4.txt	PUT	\\x157669c878a9634d7db3f215c0d08cae4740e2cd849b6c7686e319ffffac2e31	1795876863
20	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/0.txt	PUT	\\x2b2ae7f5d4e9ab0cac573f8eec3d01e67f9a5e6f65ee430b755f42190ae46b15	1795876863
21	7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	/pub/release/4.txt	DEL	\N	1795876863
\.


--
-- Data for Name: leases; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.leases (name, holder, expires_at) FROM stdin;
\.


--
-- Data for Name: pkarr_packets; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.pkarr_packets (owner, "timestamp", packet) FROM stdin;
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	1795876862253053	\\xfb99a53c9aa1ae951195cf9899eb5dad3da00ffd7e785f369f6d5325c4dd9ee1bacf5f824a26fa5d56e0305c23e7d178006b5d0b3df60610c08a019b00a83900000661572a6f57fd000080000000000100000000065f7075626b7934746b7271387a6d77623861336d396b313563737533713137716d6667716e703964736b6272673975713172796470797870377179000041000100000e100038000034743473796a786e7435717279747236733366693437796f61353477643578666365663365383637737268316d6f796b6d3966677900
\.


--
-- Data for Name: retired_blobs; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.retired_blobs (blob_key, retired_at) FROM stdin;
\.


--
-- Data for Name: seen_signatures; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.seen_signatures (signature_id, expires_at) FROM stdin;
\.


--
-- Data for Name: sessions; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.sessions (token_hash, owner, capabilities, created_at, expires_at) FROM stdin;
\.


--
-- Data for Name: signup_tokens; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.signup_tokens (token, created_at, used_by, used_at) FROM stdin;
KPOX-K6I2-3DIV	1795876863	\N	\N
\.


--
-- Data for Name: users; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.users (public_key, created_at, used_bytes, quota_bytes, disabled, last_activity, signup_token) FROM stdin;
7ir1ttte48bcp4zjychjyscicrwi1j34mtt91ptsafdbjmr8g9eo	1795876862	5799	\N	f	1795876863	\N
orhzqdiexwmi6iidktucgud63ufa5nwtsuzdxe176a8izd6jsqky	1795876862	5799	\N	f	1795876862	\N
tkrq8zmwb8a3m9k15csu3q17qmfgqnp9dskbrg9uq1rydpyxp7qy	1795876861	5799	\N	f	1795876862	\N
\.


--
-- Name: events_cursor_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.events_cursor_seq', 21, true);


--
-- Name: _sqlx_migrations _sqlx_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public._sqlx_migrations
    ADD CONSTRAINT _sqlx_migrations_pkey PRIMARY KEY (version);


--
-- Name: entries entries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.entries
    ADD CONSTRAINT entries_pkey PRIMARY KEY (owner, path);


--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (cursor);


--
-- Name: leases leases_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (name);


--
-- Name: pkarr_packets pkarr_packets_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pkarr_packets
    ADD CONSTRAINT pkarr_packets_pkey PRIMARY KEY (owner);


--
-- Name: retired_blobs retired_blobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.retired_blobs
    ADD CONSTRAINT retired_blobs_pkey PRIMARY KEY (blob_key);


--
-- Name: seen_signatures seen_signatures_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.seen_signatures
    ADD CONSTRAINT seen_signatures_pkey PRIMARY KEY (signature_id);


--
-- Name: sessions sessions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (token_hash);


--
-- Name: signup_tokens signup_tokens_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.signup_tokens
    ADD CONSTRAINT signup_tokens_pkey PRIMARY KEY (token);


--
-- Name: users users_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.users
    ADD CONSTRAINT users_pkey PRIMARY KEY (public_key);


--
-- Name: entries_blob_key; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX entries_blob_key ON public.entries USING btree (blob_key);


--
-- Name: events_owner_cursor; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX events_owner_cursor ON public.events USING btree (owner, cursor);


--
-- Name: retired_blobs_retired_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX retired_blobs_retired_at ON public.retired_blobs USING btree (retired_at);


--
-- Name: seen_signatures_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX seen_signatures_expiry ON public.seen_signatures USING btree (expires_at);


--
-- Name: sessions_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sessions_expiry ON public.sessions USING btree (expires_at);


--
-- Name: sessions_owner; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sessions_owner ON public.sessions USING btree (owner);


--
-- Name: entries entries_owner_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.entries
    ADD CONSTRAINT entries_owner_fkey FOREIGN KEY (owner) REFERENCES public.users(public_key);


--
-- Name: pkarr_packets pkarr_packets_owner_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.pkarr_packets
    ADD CONSTRAINT pkarr_packets_owner_fkey FOREIGN KEY (owner) REFERENCES public.users(public_key);


--
-- Name: sessions sessions_owner_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sessions
    ADD CONSTRAINT sessions_owner_fkey FOREIGN KEY (owner) REFERENCES public.users(public_key);


--
-- PostgreSQL database dump complete
--

\unrestrict 9aMrx5pW1X5hMUckDRz5suntY6kRn5TUolcGIQG0pIpaNLyr25YMAdaKYM5OXBO

