"""Writes a small corpus in the Brown layout (tagged words, cats.txt) into ./brown: 16 files of
three sentences repeated ROUNDS times (argv[1], default 30), for tests that prepare a dataset."""
import os
import sys

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
os.makedirs("brown", exist_ok=True)
open("brown/cats.txt", "w").write("ca01 news\n")
s = ["The/at jury/nn said/vbd it/pps did/dod find/vb that/cs many/ap of/in the/at practices/nns "
     "were/bed well/ql handled/vbn ./.",
     "The/at city/nn committee/nn ,/, which/wdt had/hvd charge/nn of/in the/at election/nn ,/, "
     "deserves/vbz praise/nn ./.",
     "A/at new/jj law/nn would/md be/be passed/vbn quickly/rb ;/. voters/nns agreed/vbd ./."]
for f in range(16):
    text = "".join("\n\n\t" + s[(f + r) % 3] + "\n" for r in range(rounds))
    open("brown/c%s%02d" % ("abc"[f % 3], f), "w").write(text)
