"""Runs the README's PyTorch example ("Use S3R in your PyTorch model": its ```python block) as
written, and checks that it prints its last line and that the loss fell.
Usage: readme_example.py README.md   (PYTHONPATH: s3r_torch's folder)"""
import re
import subprocess
import sys

text = open(sys.argv[1]).read()
section = text.split("## Use S3R in your PyTorch model", 1)
if len(section) != 2:
    raise SystemExit("readme_example: no section 'Use S3R in your PyTorch model' in the README")
block = re.search(r"```python\n(.*?)```", section[1], re.S)
if not block:
    raise SystemExit("readme_example: no ```python block in that section")
code = block.group(1)
print(f"readme_example: {len(code.splitlines())} lines")
out = subprocess.run(["/usr/bin/python3", "-c", code], check=True, capture_output=True, text=True).stdout
print(out, end="")
m = re.search(r"step 50: loss ([0-9.]+)", out)
if not m or not float(m.group(1)) < 0.5:
    raise SystemExit("readme_example: expected 'step 50: loss L' with L < 0.5 (it starts near 1.0)")
