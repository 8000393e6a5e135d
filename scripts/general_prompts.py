"""Write general instruction prompts for head training: translation, summarization, questions
over a passage, short factual questions and writing tasks: the kinds of request the training
splits in ../shared/data lack. Responses are left empty: `quickdraft train --distill` has the
target answer them (heads learn the target's answers, not a dataset's).

Nothing here comes from an evaluation set: German sentences are built from a small grammar
written for this script; passages are responses from the GPTeacher roleplay training split.

    python scripts/general_prompts.py --output data/general-prompts.jsonl
    python scripts/general_prompts.py --kind open --count 4400 --output data/open-prompts.jsonl
    (a larger --count keeps the smaller one's prompts first, in order: 3,200 made the earlier file)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SUBJECTS = [
    "Der Bürgermeister",
    "Die Regierung",
    "Das Unternehmen",
    "Meine Schwester",
    "Die Polizei",
    "Der Trainer",
    "Die Ärztin",
    "Unser Nachbar",
    "Die Zentralbank",
    "Der Minister",
    "Die Schule",
    "Das Museum",
    "Der Verein",
    "Die Stadt",
    "Ein Sprecher der Firma",
    "Die Forscherin",
    "Der Präsident",
    "Die Gewerkschaft",
    "Das Gericht",
    "Der Autor",
    "Die Mannschaft",
    "Mein Vater",
    "Die Bahn",
    "Der Konzern",
    "Die Lehrerin",
]
# (finite verb, object, closing part): the adverbial goes between the verb and the object.
PREDICATES = [
    ("hat", "einen neuen Plan", "vorgestellt"),
    ("will", "die Steuern", "senken"),
    ("hat", "das wichtige Spiel", "gewonnen"),
    ("kritisiert", "die Entscheidung des Gerichts", ""),
    ("arbeitet", "an einem großen Projekt", ""),
    ("hat", "mehr Geld für Schulen", "gefordert"),
    ("plant", "eine Reise nach Berlin", ""),
    ("hat", "die Preise", "erhöht"),
    ("sucht", "neue Mitarbeiter", ""),
    ("hat", "einen Bericht über die Umwelt", "veröffentlicht"),
    ("muss", "die alte Brücke", "reparieren"),
    ("eröffnet", "ein neues Geschäft", ""),
    ("hat", "den Vertrag", "unterschrieben"),
    ("möchte", "die Zahl der Unfälle", "verringern"),
    ("hat", "ein Buch über die Geschichte der Stadt", "geschrieben"),
    ("bietet", "kostenlose Kurse für Kinder", "an"),
    ("hat", "die Wahl", "verloren"),
    ("baut", "neue Wohnungen am Stadtrand", ""),
    ("hat", "vor den Gefahren des Klimawandels", "gewarnt"),
    ("will", "den Hafen", "modernisieren"),
]
ADVERBIALS = [
    "",
    "am Montag",
    "trotz der Krise",
    "nach langen Verhandlungen",
    "in der Hauptstadt",
    "im vergangenen Jahr",
    "laut einem Bericht",
    "überraschend",
    "seit mehreren Monaten",
    "erneut",
    "in dieser Woche",
    "wegen der hohen Kosten",
]
TAILS = [
    "",
    ", sagte ein Sprecher",
    ", weil die Kosten gestiegen sind",
    ", obwohl viele Bürger dagegen sind",
    ", wie die Zeitung berichtet",
    ", um die Wirtschaft zu stärken",
]

TOPICS = [
    "photosynthesis",
    "the water cycle",
    "inflation",
    "black holes",
    "the immune system",
    "machine learning",
    "the French Revolution",
    "plate tectonics",
    "vaccines",
    "the stock market",
    "climate change",
    "DNA",
    "the Roman Empire",
    "electric cars",
    "the internet",
    "gravity",
    "democracy",
    "volcanoes",
    "sleep",
    "renewable energy",
    "the printing press",
    "antibiotics",
    "supply and demand",
    "the moon landing",
    "recycling",
    "earthquakes",
    "the human heart",
    "cryptocurrency",
    "the Renaissance",
    "coral reefs",
]
QUESTIONS = [
    "What is {}?",
    "Explain {} in simple terms.",
    "Why is {} important?",
    "How does {} work?",
    "Give three facts about {}.",
    "What are the main causes and effects of {}?",
    "Describe the history of {} briefly.",
    "What is a common misconception about {}?",
]
FACTS = [
    "Who wrote Romeo and Juliet?",
    "What is the capital of Australia?",
    "How many planets are in the solar system?",
    "Who painted the Mona Lisa?",
    "What is the largest ocean on Earth?",
    "When did the Second World War end?",
    "What is the boiling point of water in Fahrenheit?",
    "Who discovered penicillin?",
    "What language is spoken in Brazil?",
    "What is the tallest mountain in Africa?",
    "Who was the first person to walk on the moon?",
    "What is the chemical symbol for gold?",
    "How many bones are in the adult human body?",
    "What is the longest river in Europe?",
    "Who invented the telephone?",
    "What is the speed of light?",
    "Which planet is known as the red planet?",
    "What is the smallest prime number?",
    "Who composed the Ninth Symphony?",
    "What is the currency of Japan?",
]
WRITING = [
    "Write a short story about {}.",
    "Write a poem about {}.",
    "Write a blog post about {}.",
    "Write a persuasive paragraph about {}.",
    "Write an email to a friend about {}.",
    "Write a product description for a book about {}.",
]
THEMES = [
    "a lost dog finding its way home",
    "a rainy day in the city",
    "learning to cook",
    "a trip to the mountains",
    "the first day at a new job",
    "a robot that wants to be a painter",
    "a small bakery",
    "friendship",
    "a summer festival",
    "saving money",
    "a journey by train",
    "an old lighthouse",
    "starting to exercise",
    "a garden in spring",
    "moving to a new country",
]
PASSAGE_QUESTIONS = [
    "What is the main point of the text above?",
    "Who is speaking in the text above, and what do they want?",
    "List the key facts mentioned in the text above.",
    "What advice does the text above give?",
]


# Open-ended requests (--kind open): questions on many subjects, writing, advice, reasoning,
# role-play and extraction, the kinds of chat a general assistant gets.
SUBJECT_AREAS = [
    "the Silk Road",
    "the Great Wall of China",
    "the Amazon rainforest",
    "the Industrial Revolution",
    "the theory of evolution",
    "quantum computing",
    "the Olympic Games",
    "the Cold War",
    "the human brain",
    "honeybees",
    "the Pyramids of Giza",
    "solar panels",
    "the United Nations",
    "the Industrial age of steam",
    "jazz music",
    "the Byzantine Empire",
    "artificial intelligence",
    "the circulatory system",
    "glaciers",
    "the Magna Carta",
    "public libraries",
    "tea",
    "coffee",
    "the periodic table",
    "electricity",
    "the printing of money",
    "the Silk industry",
    "bridges",
    "airplanes",
    "the Arctic",
    "deserts",
    "the Moon",
    "Mars",
    "dinosaurs",
    "the Internet of Things",
    "social media",
    "the Beatles",
    "Shakespeare",
    "the Nobel Prize",
    "chess",
    "the Mediterranean diet",
    "nuclear power",
    "rainbows",
    "tides",
    "hurricanes",
    "the ozone layer",
    "the Eiffel Tower",
    "the Vikings",
    "the Aztecs",
    "ancient Greece",
    "the Ming dynasty",
    "the Wright brothers",
    "Marie Curie",
    "Isaac Newton",
    "Albert Einstein",
    "Charles Darwin",
    "Leonardo da Vinci",
    "the stock exchange",
    "central banks",
    "unemployment",
    "taxes",
    "public transport",
    "urban gardens",
    "remote work",
    "online privacy",
    "password security",
    "open-source software",
    "video games",
    "the human skeleton",
    "sleep cycles",
    "meditation",
    "marathon running",
    "vegetarian diets",
]
OPEN_QUESTIONS = [
    "Who or what is {} best known for?",
    "What should everyone know about {}?",
    "When did {} become important, and why?",
    "Where can one learn more about {}?",
    "What are the advantages and disadvantages of {}?",
    "How has {} changed over time?",
    "Compare {} with something similar and explain the differences.",
    "What questions do scientists or historians still ask about {}?",
    "Summarize what is known about {} in one paragraph.",
    "Explain {} to a ten-year-old.",
]
OPEN_TASKS = [
    "Write a short speech about {}.",
    "Write a dialogue between two friends discussing {}.",
    "Write a limerick about {}.",
    "Write a news headline and a short article about {}.",
    "Draft a social media post about {}.",
    "Write a haiku about {}.",
    "Give me five interview questions about {}.",
    "Create a short quiz with answers about {}.",
    "Imagine you are a tour guide. Describe {} to visitors.",
    "Pretend to be a teacher and give a two-minute lesson on {}.",
    "Write a product review in the voice of someone who loves {}.",
    "List the pros and cons of {} in a table.",
    "Write a motivational message about {}.",
    "Outline a five-part presentation about {}.",
]
ADVICE = [
    "How can I improve my {}?",
    "What is a good plan to start {}?",
    "What mistakes do beginners make with {}?",
    "Give me a step-by-step guide to {}.",
    "How do I explain {} to my parents?",
]
SKILLS = [
    "public speaking",
    "time management",
    "learning a new language",
    "saving for a house",
    "running",
    "writing a resume",
    "cooking for a family",
    "learning to code in Python",
    "growing tomatoes",
    "keeping a journal",
    "studying for exams",
    "negotiating a salary",
    "drawing portraits",
    "playing the guitar",
    "taking better photos",
    "making new friends in a new city",
    "reading more books",
    "sleeping better",
    "managing a small team",
    "planning a wedding",
]
PUZZLES = [
    "If a train leaves at {} and travels for {} hours, when does it arrive? Explain.",
    "A box holds {} apples. How many boxes are needed for {} apples? Show your work.",
    "Is {} a prime number? Explain how you know, and what {} divided by 3 leaves.",
    "I have {} coins and give away {}. How many are left, and what fraction did I give away?",
]
EXTRACT = [
    "Extract the names of all people mentioned in the text below and list them.\n\n{}",
    "List every number in the text below and say what it refers to.\n\n{}",
    "Rewrite the text below in a formal tone.\n\n{}",
    "Give the text below a title and three keywords.\n\n{}",
]


def open_prompts(passages: list[str], count: int, seed: int = 1) -> list[dict]:
    """`count` open-ended prompts in six kinds, in a fixed order for a seed."""
    rng = random.Random(seed)
    makers = [
        lambda: rng.choice(OPEN_QUESTIONS).format(rng.choice(SUBJECT_AREAS)),
        lambda: rng.choice(OPEN_TASKS).format(rng.choice(SUBJECT_AREAS + THEMES)),
        lambda: rng.choice(ADVICE).format(rng.choice(SKILLS)),
        lambda: rng.choice(PUZZLES).format(*(rng.randint(2, 97) for _ in range(2))),
        lambda: rng.choice(EXTRACT).format(rng.choice(passages)),
        lambda: rng.choice(QUESTIONS + OPEN_QUESTIONS).format(rng.choice(TOPICS + SUBJECT_AREAS)),
    ]
    return _distinct(makers, count)


def german_sentence(rng: random.Random) -> str:
    verb, obj, end = rng.choice(PREDICATES)
    parts = [rng.choice(SUBJECTS), verb, rng.choice(ADVERBIALS), obj, end]
    return " ".join(p for p in parts if p) + rng.choice(TAILS) + "."


def general_prompts(passages: list[str], count: int, seed: int = 0) -> list[dict]:
    """`count` prompts in six kinds, in a fixed order for a seed."""
    rng = random.Random(seed)
    makers = [
        lambda: "Translate German to English: " + german_sentence(rng),
        lambda: "Translate German to English: " + german_sentence(rng) + " " + german_sentence(rng),
        lambda: "Summarize: " + rng.choice(passages),
        lambda: rng.choice(passages) + "\n\n" + rng.choice(PASSAGE_QUESTIONS),
        lambda: rng.choice(QUESTIONS).format(rng.choice(TOPICS)),
        lambda: rng.choice(FACTS),
        lambda: rng.choice(WRITING).format(rng.choice(THEMES)),
    ]
    return _distinct(makers, count)


def _distinct(makers: list, count: int) -> list[dict]:
    """Prompts from the makers in turn, each new; a maker that finds none new in 20 tries is skipped."""
    seen, prompts, turn = set(), [], 0
    while len(prompts) < count:
        make, turn = makers[turn % len(makers)], turn + 1
        for _ in range(20):  # a few tries for a new one; a kind that has run out is skipped this turn
            prompt = make()
            if prompt not in seen:
                seen.add(prompt)
                prompts.append({"prompt": prompt, "response": ""})
                break
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=Path("data/general-prompts.jsonl"))
    parser.add_argument("--count", type=int, default=700)
    parser.add_argument(
        "--kind",
        choices=("general", "open"),
        default="general",
        help="general: translation, summaries, questions (data/general-prompts.jsonl); "
        "open: open-ended chat requests (data/open-prompts.jsonl)",
    )
    parser.add_argument(
        "--passages", type=Path, default=Path("../shared/data/gpteacher/roleplay-simple-deduped-roleplay-instruct.json")
    )
    args = parser.parse_args()
    records = json.loads(args.passages.read_text(encoding="utf-8"))
    # Passages from the end of the split: the first examples are trained on as prompts already.
    passages = [r["response"] for r in records[-600:] if 300 <= len(r.get("response", "")) <= 1500]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as out:
        for record in (general_prompts if args.kind == "general" else open_prompts)(passages, args.count):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {args.count} prompts to {args.output}")


if __name__ == "__main__":
    main()
