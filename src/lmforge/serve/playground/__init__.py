"""The playground page served at ``/``: index.html, playground.js and playground.css, read as package data.

Plain HTML and JavaScript with no build step and nothing fetched from the internet: the page talks to the
same server's /v1/models, /v1/chat/completions (streamed, with the conversation as history) and
/v1/completions (with its sampling settings shown and editable), and /v1/search (an index folder of
``lmforge index build``).
"""
