"""runtime/image_decode.py: every bad image of issue 47 gets one ImageError line (or is converted, with a note where it
matters), every file generated here with Pillow (or, for what Pillow does not write, byte by byte)."""

from __future__ import annotations

import base64
import gzip
import io
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from dflash_chat.runtime import image_decode
from dflash_chat.runtime.image_decode import ImageError, decode_bytes, decode_data_url, decode_file


def encoded(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def gradient(width: int = 64, height: int = 48) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x * 4 % 256, y * 5 % 256, (x + y) % 256], -1).astype(np.uint8))


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, depth: int, colour: int, rows: bytes) -> bytes:
    """A PNG written by hand (Pillow writes no 16-bit colour PNGs, and no lying headers)."""
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_plain_png_comes_back_as_the_same_rgb_pixels_with_its_hash():
    image = gradient()
    data = encoded(image)
    decoded = decode_bytes(data)
    assert decoded.image.mode == "RGB" and decoded.size == (64, 48) and decoded.format == "PNG"
    assert np.array_equal(np.asarray(decoded.image), np.asarray(image))
    assert decoded.digest == decode_bytes(data).digest != decode_bytes(encoded(image.rotate(90))).digest
    assert decoded.note == ""


def test_not_an_image_is_refused_saying_what_is_read():
    with pytest.raises(ImageError) as exc:
        decode_bytes(b"%PDF-1.7 this is a document, not a picture", "report.pdf")
    assert "report.pdf is not an image" in one_line(exc) and "PNG" in str(exc.value)
    with pytest.raises(ImageError, match="empty"):
        decode_bytes(b"", "nothing.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_a_truncated_image_is_refused_as_cut_short(fmt):
    data = encoded(gradient(256, 256), fmt)
    with pytest.raises(ImageError) as exc:
        decode_bytes(data[: len(data) // 2], f"half.{fmt.lower()}")
    assert one_line(exc).startswith(f"half.{fmt.lower()} is damaged or cut short (")


def test_a_decompression_bomb_is_refused_before_it_is_decoded():
    # a 50k x 50k PNG whose few bytes claim 2.5 billion pixels: Pillow's own DecompressionBombError
    bomb = png(50_000, 50_000, 8, 0, b"\x00" * 64)
    with pytest.raises(ImageError) as exc:
        decode_bytes(bomb, "bomb.png")
    assert "too many pixels" in one_line(exc) and "scale it down" in str(exc.value)
    # under Pillow's error threshold (which only warns there) but over ours: our check, with the size named
    big = png(12_000, 12_000, 8, 0, b"\x00" * 64)
    with _no_warnings():
        with pytest.raises(ImageError, match=r"12000 x 12000"):
            decode_bytes(big, "big.png")


class _no_warnings:
    """Pillow's DecompressionBombWarning is ours to decide on: it must not leak to the caller."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self.seen = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        assert not [w for w in self.seen if "Decompression" in type(w.message).__name__]
        return False


@pytest.mark.parametrize(
    "data",
    [
        b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>',
        b'\xef\xbb\xbf<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"></svg>',
        gzip.compress(b'<svg xmlns="http://www.w3.org/2000/svg"></svg>'),
    ],
    ids=["svg", "xml-svg", "svgz"],
)
def test_svg_is_refused_saying_so(data):
    with pytest.raises(ImageError) as exc:
        decode_bytes(data, "drawing")
    assert "SVG" in one_line(exc) and "PNG" in str(exc.value)


def test_an_svg_file_is_refused_by_its_content_or_name_and_as_a_data_url(tmp_path):
    path = tmp_path / "logo.svg"
    path.write_bytes(b"<!-- " + b"x" * 2000 + b' --><svg xmlns="http://www.w3.org/2000/svg"/>')  # past the sniff
    with pytest.raises(ImageError, match="logo.svg is an SVG"):
        decode_file(path)
    misnamed = tmp_path / "chart.svg"
    misnamed.write_bytes(encoded(gradient()))  # a PNG by its bytes: read as one
    assert decode_file(misnamed).format == "PNG"
    url = "data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode()
    with pytest.raises(ImageError, match="SVG"):
        decode_data_url(url)


def test_cmyk_jpeg_is_converted_to_rgb():
    rgb = Image.new("RGB", (40, 30), (200, 30, 60))
    cmyk = rgb.convert("CMYK")
    decoded = decode_bytes(encoded(cmyk, "JPEG", quality=95))
    assert Image.open(io.BytesIO(encoded(cmyk, "JPEG"))).mode == "CMYK"
    assert decoded.image.mode == "RGB"
    assert np.abs(np.asarray(decoded.image).astype(int) - (200, 30, 60)).max() <= 12


def test_16_bit_grey_png_is_scaled_not_clipped():
    grey = np.linspace(0, 65535, 64 * 16).reshape(16, 64).astype(np.uint16)
    data = encoded(Image.fromarray(grey))
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    out = np.asarray(decode_bytes(data).image)
    assert out.shape == (16, 64, 3) and out.dtype == np.uint8
    # Pillow's convert("RGB") would clip everything above 255 to white; scaled, the ramp survives
    assert np.allclose(out[..., 0], np.rint(grey / 257.0), atol=1)


def test_16_bit_rgb_png_is_read_as_8_bit_rgb():
    pixels = np.zeros((8, 8, 3), np.uint16)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 65535, 32768, 0
    rows = b"".join(b"\x00" + row.astype(">u2").tobytes() for row in pixels)
    decoded = decode_bytes(png(8, 8, 16, 2, rows))
    out = np.asarray(decoded.image)
    assert decoded.image.mode == "RGB" and np.abs(out.astype(int) - (255, 128, 0)).max() <= 1


def test_palette_png_with_transparency_is_laid_over_white():
    palette = Image.new("P", (20, 10), 0)
    palette.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    palette.paste(1, (10, 0, 20, 10))
    data = encoded(palette, transparency=0)  # index 0 (red) transparent
    assert Image.open(io.BytesIO(data)).mode == "P"
    out = np.asarray(decode_bytes(data).image)
    assert (out[:, :10] == 255).all()  # transparent -> white, as the reference's convert_to_rgb
    assert (out[:, 10:] == (0, 0, 255)).all()


def test_rgba_is_laid_over_white():
    rgba = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    out = np.asarray(decode_bytes(encoded(rgba)).image)
    assert (out == 255).all()


def test_an_animated_gif_gives_its_first_frame_and_says_so():
    frames = [Image.new("RGB", (16, 16), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    decoded = decode_bytes(data, "spin.gif")
    assert (np.asarray(decoded.image) == (255, 0, 0)).all()
    assert decoded.note == "spin.gif is an animated GIF of 3 frames: its first frame is used"


def test_exif_rotation_is_applied():
    image = Image.new("RGB", (40, 20), (0, 0, 0))
    image.paste((255, 255, 255), (0, 0, 10, 20))  # white on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    decoded = decode_bytes(encoded(image, "JPEG", exif=exif, quality=95))
    out = np.asarray(decoded.image)
    assert decoded.size == (20, 40)
    assert out[:10].mean() > 200 and out[-10:].mean() < 50  # the left edge now on top


def test_over_the_pixel_budget_the_tower_input_resizes_it_as_the_reference():
    from dflash_chat.engine.models import vision_input
    from dflash_chat.engine.models.vision_input import ImageConfig

    assert image_decode.MAX_ASPECT == vision_input.MAX_ASPECT
    cfg = ImageConfig(min_pixels=32 * 32, max_pixels=64 * 64)
    decoded = decode_bytes(encoded(gradient(400, 300)))
    assert decoded.size == (400, 300)  # decoding keeps every pixel; the budget is the tower input's
    array = vision_input.image_array(decoded.image, cfg)
    assert array.shape[1] * array.shape[2] <= cfg.max_pixels
    assert array.shape[1:] == vision_input.smart_resize(300, 400, cfg)


def test_a_long_thin_image_is_refused_as_the_reference_would():
    with pytest.raises(ImageError) as exc:
        decode_bytes(encoded(Image.new("L", (4020, 10))), "strip.png")
    assert "4020 x 10" in one_line(exc) and "crop" in str(exc.value)


def test_data_urls(tmp_path):
    data = encoded(gradient())
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert decode_data_url(url).digest == decode_bytes(data).digest
    wrapped = "data:image/png;base64," + "\n".join(base64.encodebytes(data).decode().split())
    assert decode_data_url(wrapped).size == (64, 48)
    for bad, words in [
        ("https://example.com/cat.png", "not a data URL"),
        ("data:text/plain;base64,aGVsbG8=", "text/plain, not an image"),
        ("data:image/png,rawbytes", "without ;base64"),
        ("data:image/png;base64,@@@@", "base64 is damaged"),
    ]:
        with pytest.raises(ImageError, match=words):
            decode_data_url(bad)


def test_size_limits_are_checked_before_decoding(monkeypatch, tmp_path):
    monkeypatch.setattr(image_decode, "MAX_BYTES", 1000)
    url = "data:image/png;base64," + "A" * 4000
    with pytest.raises(ImageError, match=r"up to 0 MiB|MiB; images up to"):
        decode_data_url(url)
    path = tmp_path / "large.png"
    path.write_bytes(b"\0" * 2000)
    with pytest.raises(ImageError, match="large.png is"):
        decode_file(path)


def test_file_errors_are_one_line(tmp_path):
    with pytest.raises(ImageError, match="no such file"):
        decode_file(tmp_path / "missing.png")
    with pytest.raises(ImageError, match="is a folder"):
        decode_file(tmp_path)
    path = tmp_path / "photo.jpg"
    path.write_bytes(encoded(gradient(), "JPEG"))
    assert decode_file(path).format == "JPEG"


def test_importing_it_imports_no_torch():
    code = "import sys, dflash_chat.runtime.image_decode; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
