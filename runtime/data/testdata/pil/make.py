"""Reference images for runtime/data's tests, made with Pillow itself.

Run with a Python that has Pillow and NumPy (the files here were made with
Debian bookworm's python3-pil 9.4.0, libjpeg-turbo 2.1 and libwebp 1.2.4):

    python3 make.py /path/to/GoMNIST/data

src.png is a 53x41 RGB mosaic of MNIST test digits (one digit arrangement
per channel, plus a gradient); every other file is what Pillow does to it:
resize_{rgb,l}_WxH.png is src.png converted to RGB / L and resized with
Image.resize((W, H), BILINEAR), which is what torchvision's Resize((H, W))
calls; l.png is convert("L"); the *.jpg, *.webp and 16-bit PNG files
are encodings of src.png and decoded_*.png Pillow's convert("RGB") of them.
"""
import gzip
import struct
import sys
import zlib

import numpy as np
from PIL import Image

SIZES = [(128, 128), (20, 17), (60, 28), (7, 5), (53, 90), (200, 41)]


def mnist_digits(path, count):
    with gzip.open(path + "/t10k-images-idx3-ubyte.gz") as f:
        data = f.read()
    return np.frombuffer(data, np.uint8, offset=16).reshape(-1, 28, 28)[:count]


def png16(path, rgb16):
    """Write a 16-bit RGB PNG (Pillow cannot)."""
    h, w, _ = rgb16.shape
    raw = b"".join(b"\0" + rgb16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, body):
        c = struct.pack(">I", len(body)) + kind + body
        return c + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def main(mnist_dir):
    d = mnist_digits(mnist_dir, 4)
    mosaic = lambda a, b, c, e: np.block([[d[a], d[b]], [d[c], d[e]]])
    yy, xx = np.mgrid[0:56, 0:56]
    src = np.stack([mosaic(0, 1, 2, 3),
                    mosaic(3, 2, 1, 0),
                    ((xx * 4 + yy * 2) % 256).astype(np.uint8) // 2 + mosaic(1, 3, 0, 2) // 2],
                   axis=-1)[:41, :53]
    im = Image.fromarray(np.ascontiguousarray(src), "RGB")
    im.save("src.png")
    for mode in ("RGB", "L"):
        conv = im.convert(mode)
        for w, h in SIZES:
            conv.resize((w, h), Image.BILINEAR).save(f"resize_{mode.lower()}_{w}x{h}.png")
    im.convert("L").save("l.png")
    im.save("ycc.jpg", quality=90)  # 4:2:0
    im.save("ycc422.jpg", quality=90, subsampling=1)
    im.save("ycc444.jpg", quality=90, subsampling=0)
    im.crop((0, 0, 52, 40)).save("ycc_even.jpg", quality=90)
    im.crop((0, 0, 52, 40)).save("lossy_even.webp", quality=80)
    im.convert("CMYK").save("cmyk.jpg", quality=90)
    im.save("lossless.webp", lossless=True)
    im.save("lossy.webp", quality=80)
    # 16-bit: high byte = src, low byte = a pattern Pillow must drop.
    png16("rgb16.png", src.astype(np.uint16) * 256 + (xx[:41, :53, None] * 37 % 256).astype(np.uint16))
    for name in ("ycc.jpg", "ycc422.jpg", "ycc444.jpg", "ycc_even.jpg", "cmyk.jpg",
                 "lossless.webp", "lossy.webp", "lossy_even.webp", "rgb16.png"):
        dec = Image.open(name)
        print(name, dec.mode)
        dec.convert("RGB").save("decoded_" + name.replace(".", "_") + ".png")


if __name__ == "__main__":
    main(sys.argv[1])
