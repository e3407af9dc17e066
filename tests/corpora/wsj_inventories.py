"""Real WSJ transcript marker inventories, compiled from the WSJ transcripts by public projects
(quoted small, each with its repository, path and commit). Used by tests/test_wsj.py to check
the Kaldi normalization and the CAPE setting on every token that occurs in the real corpus.

Raw forms (as in the ``.dot`` files, upper-cased by the projects; backslashes are the
transcripts' own quoting):

* :data:`PYAUDLIB` -- raymondxyy/pyaudlib, ``egs/asr/dataset.py`` (commit 05eb1ecb7935),
  the keys of ``REPLMAP`` ("special WSJ transcripts to be replaced", WSJ0 training data)
  that are whole tokens (single characters such as ``:`` or ``~`` are left out).
* :data:`ESPNET` -- espnet/espnet, ``egs2/wsj/asr1/local/prepare_transcription_whisper.py``
  (commit 3d89d785350f), the keys of ``symbol_map`` (verbalized punctuation of the raw WSJ
  transcripts), whole tokens only.

Kaldi-normalized forms (after ``normalize_transcript.pl``):

* :data:`SMS_WSJ` -- fgnt/sms_wsj, ``sms_wsj/database/create_intermediate_json.py``
  (commit 6ae4001a4955), ``PUNCTUATION_SYMBOLS``.
* :data:`NEURAL_SP` -- hirofumi0810/neural_sp, ``examples/wsj/s5/run.sh`` (commit
  1ea51de4aeae), the lower-cased punctuation tokens its sed script rewrites in the si284 text.
"""
from __future__ import annotations

PYAUDLIB = r"""
[LOUD_BREATH] [LOUD_BEATH] [LIP_SMACK] [TONGUE_CLICK] [<DOOR_SLAM] [MISC_NOISE>] [DOOR_SLAM]
[DOOR_SLAM>] [EXHALATION] [LOUD-BREATH] [MICROPHONE_MVT] [MICROPHONE_MVT>] [<MICROPHONE_MVT>]
[/MICROPHONE_MVT] [MICROPHONE_MVT/] [CHAIR_SQUEAK>] [<CHAIR_SQUEAK] [<TAP] [TAP>] [<TAP>]
[DOOR_OPEN/] [/DOOR_OPEN] [DOOR_OPEN>] [BEEP/] [/BEEP] [BEEP>] [BEEP] [SIGH] [CROSS_TALK]
[CROSS_TALK/] [/CROSS_TALK] [CROSS_TALK>] [TAP] [THROAT_CLEAR] [UNINTELLIGIBLE] [DISK_NOISE/]
[/DISK_NOISE] [DISK_NOISE] [CHAIR_SQUEAK] [MISC_NOISE] [MISC_NOISE/] [/MISC_NOISE]
[PHONE_RING/] [PHONE_RING] [<PHONE_RING] [/PHONE_RING] [PAPER_RUSTLE/] [PAPER_RUSTLE] [<BEEP]
[MOVEMENT/] [/MOVEMENT] [MOVEMENT] [TYPING/] [/TYPING] [<THUMP] [SNIFF] [UH] [UM] [LAUGHTER/]
[/LAUGHTER]
\?QUESTION\-MAR(K)- FORECAS(TS)- \.PER(IOD)- -(PER)IOD FL(OW)- D(EPORTATIONS)- F(IVE)-
REVO(LUTIONARY)- EC(CONOMISTS)- FINAN(CIALLY)- AN(NOUNCED)- PRIST(INE)- W(ORLD)-
\~NEW\-GRAPH \/SLASH \"OPEN\-QUOTES \"CLOSE\-QUOTES \"OPEN\-QUOTE \"CLOSE\-QUOTE \"QUOTES
\"QUOTE \"UNQUOTE \"END\-QUOTE \!EXCLAMATION\-POINT \!EXCLAMATION-POINT \.PERIOD \,COMMA
\%PERCENT \-HYPHEN \"DOUBLE\-QUOTE \"DOUBLE-QUOTE \?QUESTION\-MARK \?QUESTION-MARK \-\-DASH
\&AMPERSAND \:COLON \;SEMI\-COLON \;SEMI-COLON \(LEFT\-PAREN \)RIGHT\-PAREN \(LEFT-PAREN
\)RIGHT-PAREN \(PARENTHESES \)CLOSE\-PARENTHESES \(OPEN\-PAREN \)CLOSE\-PAREN \'SINGLE\-QUOTE
\{LEFT\-BRACE \{LEFT-BRACE \}RIGHT\-BRACE \}RIGHT-BRACE \$DOLLAR\-SIGN <D> <A>
""".split()

ESPNET = r"""
\-HYPHEN \,COMMA \.PERIOD \"DOUBLE\-QUOTE \"DOUBLE-QUOTE \?QUESTION\-MARK \?QUESTION-MARK
\-\-DASH \(LEFT\-PAREN \(LEFT-PAREN \)RIGHT\-PAREN \)RIGHT-PAREN \%PERCENT \&AMPERSAND
\;SEMI\-COLON \{LEFT\-BRACE \{LEFT-BRACE \}RIGHT\-BRACE \}RIGHT-BRACE \!EXCLAMATION\-POINT
\!EXCLAMATION-POINT \'SINGLE\-QUOTE \/SLASH \:COLON \;SEMI-COLON \"QUOTE \"UNQUOTE
\(PARENTHESES \)UN\-PARENTHESES \(PAREN \)PAREN \)END\-OF\-PAREN \"END\-OF\-QUOTE
\)END\-THE\-PAREN \"END-OF-QUOTE \"END\-QUOTE \)CLOSE\-PAREN \` \"CLOSE\-QUOTE \(BRACE
\)CLOSE\-BRACE \"IN\-QUOTES \(BEGIN\-PARENS \)END\-PARENS \; \(IN\-PARENTHESIS \)CLOSE_PAREN
\.POINT \.\.\. \' \.' \.
""".split()

SMS_WSJ = """
&AMPERSAND ,COMMA ;SEMI-COLON :COLON !EXCLAMATION-POINT ...ELLIPSIS -HYPHEN .PERIOD .DOT
?QUESTION-MARK .DECIMAL .PERCENT /SLASH 'SINGLE-QUOTE "DOUBLE-QUOTE "QUOTE "UNQUOTE
"END-OF-QUOTE "END-QUOTE "CLOSE-QUOTE "IN-QUOTES (PAREN (PARENTHESES (IN-PARENTHESIS (BRACE
(LEFT-PAREN (PARENTHETICALLY (BEGIN-PARENS )CLOSE-PAREN )CLOSE_PAREN )END-THE-PAREN
)END-OF-PAREN )END-PARENS )CLOSE-BRACE )RIGHT-PAREN )UN-PARENTHESES )PAREN {LEFT-BRACE
}RIGHT-BRACE
""".split()

NEURAL_SP = """
.period ,comma :colon ;semi-colon /slash &ampersand ?question-mark !exclamation-point -dash
-hyphen (paren )paren )un-parentheses )close_paren )close-paren )end-the-paren (left-paren
)right-paren (begin-parens )end-parens (brace )close-brace {left-brace }right-brace
'single-quote "quote "in-quotes "double-quote "unquote "close-quote "end-quote "end-of-quote
""".split()

#: tokens of the inventories that are spoken words (or the spoken part of one), with the CAPE
#: setting's words for them, written by hand from the rules in asrkit/data/wsj_text.py; every
#: other token of the inventories is noise, markup or verbalized punctuation and yields nothing
SPOKEN = {
    r"FORECAS(TS)-": ["FORECAS"],
    r"FL(OW)-": ["FL"],
    r"D(EPORTATIONS)-": ["D"],
    r"F(IVE)-": ["F"],
    r"REVO(LUTIONARY)-": ["REVO"],
    r"EC(CONOMISTS)-": ["EC"],
    r"FINAN(CIALLY)-": ["FINAN"],
    r"AN(NOUNCED)-": ["AN"],
    r"PRIST(INE)-": ["PRIST"],
    r"W(ORLD)-": ["W"],
    r"\%PERCENT": ["PERCENT"],
    r"\.POINT": ["POINT"],
    r"<D>": ["D"],
    r"<A>": ["A"],
}
