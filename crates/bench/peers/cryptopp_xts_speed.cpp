// Peer benchmark: Crypto++ XTS_Mode over LEA, AES, Serpent, Twofish and Camellia: throughput on
// whole data units, one thread, printed as JSON lines shaped like `sectorcrypt benchmark --json`.
// Usage: cryptopp_xts_speed UNIT_BYTES SECONDS
#include <cryptopp/aes.h>
#include <cryptopp/camellia.h>
#include <cryptopp/lea.h>
#include <cryptopp/serpent.h>
#include <cryptopp/twofish.h>
#include <cryptopp/osrng.h>
#include <cryptopp/xts.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace CryptoPP;

template <class BC>
static void run(const char *name, size_t key_bytes, size_t unit, double seconds, bool enc) {
    AutoSeededRandomPool rng;
    SecByteBlock key(key_bytes);
    rng.GenerateBlock(key, key.size());
    std::vector<byte> buf(64 * 1024);
    rng.GenerateBlock(buf.data(), buf.size());
    byte iv[16] = {0};
    typename XTS_Mode<BC>::Encryption e(key, key.size(), iv);
    typename XTS_Mode<BC>::Decryption d(key, key.size(), iv);
    auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    unsigned long long bytes = 0, sector = 0;
    while (elapsed < seconds) {
        for (size_t off = 0; off + unit <= buf.size(); off += unit, sector++) {
            // Crypto++ 8.7 needs the IV length spelled out (the default of -1 overflows).
            for (int i = 0; i < 8; i++) iv[i] = (byte)(sector >> (8 * i));
            if (enc) {
                e.Resynchronize(iv, 16);
                e.ProcessData(&buf[off], &buf[off], unit);
            } else {
                d.Resynchronize(iv, 16);
                d.ProcessData(&buf[off], &buf[off], unit);
            }
            bytes += unit;
        }
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    std::printf("{\"peer\":\"cryptopp\",\"cipher\":\"%s\",\"key_bits\":%zu,\"sector_size\":%zu,"
                "\"op\":\"%s\",\"bytes_per_sec\":%.1f}\n",
                name, key_bytes * 8, unit, enc ? "encrypt" : "decrypt", bytes / elapsed);
}

int main(int argc, char **argv) {
    size_t unit = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 4096;
    double seconds = argc > 2 ? std::atof(argv[2]) : 2.0;
    for (bool enc : {true, false}) {
        run<LEA>("lea-xts-plain64", 32, unit, seconds, enc);
        run<LEA>("lea-xts-plain64", 64, unit, seconds, enc);
        run<AES>("aes-xts-plain64", 64, unit, seconds, enc);
        run<Serpent>("serpent-xts-plain64", 64, unit, seconds, enc);
        run<Twofish>("twofish-xts-plain64", 64, unit, seconds, enc);
        run<Camellia>("camellia-xts-plain64", 64, unit, seconds, enc);
    }
    return 0;
}
