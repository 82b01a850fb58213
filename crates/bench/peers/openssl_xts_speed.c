// Peer benchmark: OpenSSL's AES-256-XTS (512-bit key) on whole data units, one thread, printed as
// JSON lines shaped like `sectorcrypt benchmark --json`. Unlike `openssl speed -evp`, each unit
// gets its own tweak (the context is re-initialised with the unit's IV only, as a disk would use
// it), so the rate includes the per-unit cost a library caller pays. Links against whichever
// libcrypto it is built with: scripts/bench-peers.sh builds it against the newest OpenSSL
// release, whose XTS has a VAES/AVX-512 kernel (Debian's OpenSSL 3.0 has none).
// Usage: openssl_xts_speed UNIT_BYTES SECONDS
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int run(size_t unit, double seconds, int enc) {
    // Whole units in at least 64 KiB, so small units walk a buffer as Crypto++'s timer does.
    size_t len = unit < 65536 ? 65536 : unit;
    unsigned char *buf = malloc(len);
    unsigned char key[64], iv[16] = {0};
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!buf || !ctx || RAND_bytes(key, sizeof key) != 1 || RAND_bytes(buf, (int)len) != 1 ||
        !EVP_CipherInit_ex2(ctx, EVP_aes_256_xts(), key, iv, enc, NULL)) {
        fprintf(stderr, "openssl_xts_speed: cannot set up AES-256-XTS\n");
        return 1;
    }
    double start = now(), elapsed = 0;
    unsigned long long bytes = 0, sector = 0;
    int out = 0;
    while (elapsed < seconds) {
        for (size_t off = 0; off + unit <= len; off += unit, sector++) {
            for (int i = 0; i < 8; i++) iv[i] = (unsigned char)(sector >> (8 * i));
            if (!EVP_CipherInit_ex2(ctx, NULL, NULL, iv, enc, NULL) ||
                !EVP_CipherUpdate(ctx, buf + off, &out, buf + off, (int)unit)) {
                fprintf(stderr, "openssl_xts_speed: AES-256-XTS failed\n");
                return 1;
            }
            bytes += unit;
        }
        elapsed = now() - start;
    }
    printf("{\"peer\":\"openssl\",\"version\":\"%s\",\"cipher\":\"aes-xts-plain64\",\"key_bits\":512,"
           "\"sector_size\":%zu,\"op\":\"%s\",\"bytes_per_sec\":%.1f}\n",
           OpenSSL_version(OPENSSL_VERSION_STRING), unit, enc ? "encrypt" : "decrypt",
           bytes / elapsed);
    EVP_CIPHER_CTX_free(ctx);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    size_t unit = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096;
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    if (unit == 0 || unit % 16 != 0 || unit > (1u << 24)) {
        fprintf(stderr, "openssl_xts_speed: the unit must be a multiple of 16 bytes up to 16 MiB\n");
        return 2;
    }
    return run(unit, seconds, 1) || run(unit, seconds, 0);
}
