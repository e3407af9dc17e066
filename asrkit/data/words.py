"""Vocabulary of the synthetic corpus (:mod:`asrkit.data.synth`).

About 500 common English words, written by hand for this project and grouped loosely by
kind. All lowercase letters, with an apostrophe in contractions ("don't"). The order is
the frequency rank used by the sentence sampler (earlier words are drawn more often), so
append new words at the end of a group rather than sorting; changing the list changes the
corpus a seed produces.
"""
from __future__ import annotations

_FUNCTION = """
the of and to a in is it you that he was for on are with as his they at be this
have from or one had by but not what all were we when your can said there use an
each which she do how their if will up other about out many then them these so some
her would make like him into time has look two more write go see number no way could
people my than first water been call who its now find long down day did get come made
may part
"""

_NOUNS = """
house home family friend mother father brother sister child children woman man girl boy
baby people world country city town village street road river water sea ocean lake
mountain hill island forest tree flower garden grass field farm animal horse dog cat bird
fish cow sheep door window table chair bed room kitchen floor wall paper book letter word
story song music picture school teacher student class lesson question answer idea reason
problem money price market store shop office company business job work worker doctor
morning evening night week month year hour minute moment summer winter spring autumn
weather rain snow wind sun moon star sky light fire stone wood glass bread milk coffee
dinner lunch breakfast food apple orange kind side head face eye ear hand foot heart
voice name car train boat ship plane bus ticket station game ball team party
"""

_VERBS = """
walk run jump sit stand sleep wake eat drink cook read sing dance play open close begin
start stop finish bring carry hold keep give take send buy sell pay spend build break fix
cut wash clean paint draw learn teach study think know understand remember forget believe
hope wish want need love like hate help ask tell speak talk listen hear watch show
follow lead meet leave stay live move turn travel drive ride fly swim climb fall grow
change try wait answer laugh smile cry shout call visit
"""

_ADJECTIVES = """
good bad new old young big small little large great high low long short early late
happy sad easy hard soft warm cold hot cool dark bright clean dirty quiet loud fast slow
rich poor strong weak full empty heavy light open busy free ready simple strange famous
beautiful pretty ugly kind gentle brave clever careful honest real true wrong right
different same important possible special whole green blue red yellow white black brown
"""

_ADVERBS = """
always never often sometimes usually again already almost also just only still very
really quite perhaps maybe today tonight tomorrow yesterday soon later here everywhere
together away back around above below inside outside behind before after during since
until without between through across toward against along
"""

_CONTRACTIONS = """
don't can't won't isn't aren't wasn't weren't didn't doesn't couldn't wouldn't shouldn't
haven't hasn't i'm you're we're they're it's that's there's let's i'll we'll you'll i've
we've they've she's he's
"""

_MORE = """
i me our us yours mine why where because while though although every any both few
most several enough another such much less own next last second third four five six seven
eight nine ten hundred thousand
"""


def _build() -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for block in (_FUNCTION, _NOUNS, _VERBS, _ADJECTIVES, _ADVERBS, _CONTRACTIONS, _MORE):
        for w in block.split():
            seen.setdefault(w, None)
    return tuple(seen)


#: The vocabulary, deduplicated, in rank order (most frequent first).
WORDS: tuple[str, ...] = _build()
