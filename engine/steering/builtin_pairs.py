"""The built-in contrast pair sets (repeng's recipe): two personas, and sentence starts each is continued from.

Kept as Python, not data files, so a packaged app carries them without a data-file rule. A set becomes
pairs by putting "Act as if you're <persona>." in the model's chat template as the user's turn and one
sentence start as the beginning of the answer, once with each persona (engine/steering/pairs.py).
"""

from __future__ import annotations

TEMPLATE = "Act as if you're {persona}."

# (positive persona, negative persona): positive strength steers toward the first.
PERSONAS: dict[str, tuple[str, str]] = {
    'calm-angry': ('completely calm and serene', 'furious and angry'),
    'concise-verbose': ('extremely concise, saying as little as possible', 'extremely verbose, saying as much as possible'),
    'formal-casual': ('an extremely formal, polite writer', 'an extremely casual, slangy texter'),
    'happy-sad': ('extremely happy and joyful', 'extremely sad and gloomy'),
}

# The answers' first words; a pair differs only in the persona, so their difference is the persona.
SUFFIXES: tuple[str, ...] = (
    'I', 'The weather today', 'When I woke up this morning,', 'My friend asked me',
    'Honestly,', 'The best thing about', 'Yesterday I', 'If you ask me,',
    'Looking out the window,', 'At work today', 'The news this morning', 'I think that',
    'Walking home, I', 'Dinner was', 'My plan for the weekend', 'The meeting',
    'To be fair,', 'When she called,', 'This song', "The book I'm reading",
    'Every time I', 'Right now I feel', 'The city', 'Our trip',
    'My first thought was', 'After lunch,', 'The letter said', 'Someone once told me',
    'The garden', 'Tomorrow', 'Let me tell you about', 'The train was',
    'In my opinion,', 'The children', 'That movie', 'Sitting here,',
    'The answer is', 'Last summer', 'My neighbour', 'The coffee',
    'You know what?', 'The story begins', 'Thinking about it,', 'On the way to school,',
    'The party', 'Here is what happened:', 'The old house', 'So',
)
