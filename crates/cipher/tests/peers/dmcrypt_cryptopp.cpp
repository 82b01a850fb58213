// Independent dm-crypt sector encryption with Crypto++ (libcrypto++-dev), for every block cipher
// sectorcrypt has: AES, LEA, Serpent, Twofish, Camellia, ARIA, SM4 and CAST6 (CAST-256).
//
// Reads jobs from stdin, one per line:  SPEC KEY_HEX SECTOR_SIZE FIRST_SECTOR DIRECTION DATA_HEX
// and prints the result as hex. SPEC is CIPHER-MODE[-IV] with MODE xts, cbc or ecb and IV plain,
// plain64, plain64be, benbi, null, eboiv or essiv:HASH. IVs count 512-byte units (LUKS2), written
// from the dm-crypt documentation:
//   plain = low 32 bits LE; plain64 = 64 bits LE; plain64be = 64 bits BE in the last 8 bytes;
//   benbi = (n * 32 + 1) BE in the last 8 bytes (the count of 16-byte blocks, plus one);
//   null = zero; eboiv = E_key(LE64(n * sector size)); essiv:HASH = E_{HASH(key)}(plain64), with
//   the kernel's hash names (wp256 = Whirlpool truncated to 32 bytes, rmd160 = RIPEMD-160).
#include <cryptopp/aes.h>
#include <cryptopp/aria.h>
#include <cryptopp/blake2.h>
#include <cryptopp/camellia.h>
#include <cryptopp/cast.h>
#include <cryptopp/hex.h>
#include <cryptopp/lea.h>
#include <cryptopp/modes.h>
#include <cryptopp/ripemd.h>
#include <cryptopp/serpent.h>
#include <cryptopp/sha.h>
#include <cryptopp/sha3.h>
#include <cryptopp/sm3.h>
#include <cryptopp/sm4.h>
#include <cryptopp/twofish.h>
#include <cryptopp/whrlpool.h>
#include <cryptopp/xts.h>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

using namespace CryptoPP;

static std::string from_hex(const std::string &h) {
    std::string out;
    StringSource(h, true, new HexDecoder(new StringSink(out)));
    return out;
}

static std::string to_hex(const std::string &b) {
    std::string out;
    StringSource(b, true, new HexEncoder(new StringSink(out), false));
    return out;
}

template <class H> static std::string digest(const std::string &key) {
    H h;
    std::string out(h.DigestSize(), '\0');
    h.CalculateDigest((byte *)&out[0], (const byte *)key.data(), key.size());
    return out;
}

// The ESSIV salt: HASH(key), by the kernel's hash name.
static std::string essiv_salt(const std::string &hash, const std::string &key) {
    if (hash == "sha1") return digest<SHA1>(key);
    if (hash == "sha256") return digest<SHA256>(key);
    if (hash == "sha512") return digest<SHA512>(key);
    if (hash == "sha3-256") return digest<SHA3_256>(key);
    if (hash == "rmd160" || hash == "ripemd160") return digest<RIPEMD160>(key);
    if (hash == "wp256") return digest<Whirlpool>(key).substr(0, 32);
    if (hash == "wp512" || hash == "whirlpool") return digest<Whirlpool>(key);
    if (hash == "sm3") return digest<SM3>(key);
    if (hash == "blake2s-256") return digest<BLAKE2s>(key);
    if (hash == "blake2b-512") return digest<BLAKE2b>(key);
    throw std::runtime_error("unsupported ESSIV hash " + hash);
}

template <class BC>
static std::string sector_op(const std::string &mode, const std::string &ivgen, const std::string &key,
                             const std::string &sector, unsigned long long n, bool enc) {
    byte iv[16] = {0};
    if (ivgen == "plain64" || ivgen.rfind("essiv:", 0) == 0) {
        for (int i = 0; i < 8; i++) iv[i] = (byte)(n >> (8 * i));
    } else if (ivgen == "plain") {
        for (int i = 0; i < 4; i++) iv[i] = (byte)(n >> (8 * i));
    } else if (ivgen == "plain64be") {
        for (int i = 0; i < 8; i++) iv[15 - i] = (byte)(n >> (8 * i));
    } else if (ivgen == "benbi") {
        unsigned long long b = (n << 5) + 1;
        for (int i = 0; i < 8; i++) iv[15 - i] = (byte)(b >> (8 * i));
    } else if (ivgen == "eboiv") {
        unsigned long long off = n * sector.size();
        for (int i = 0; i < 8; i++) iv[i] = (byte)(off >> (8 * i));
        typename ECB_Mode<BC>::Encryption e((const byte *)key.data(), key.size());
        e.ProcessData(iv, iv, 16);
    } else if (ivgen != "null" && !ivgen.empty()) {
        throw std::runtime_error("unsupported IV generator " + ivgen);
    }
    if (ivgen.rfind("essiv:", 0) == 0) {
        std::string salt = essiv_salt(ivgen.substr(6), key);
        typename ECB_Mode<BC>::Encryption e((const byte *)salt.data(), salt.size());
        e.ProcessData(iv, iv, 16);
    }
    std::string out(sector.size(), '\0');
    const byte *in = (const byte *)sector.data();
    byte *o = (byte *)&out[0];
    const byte *k = (const byte *)key.data();
    if (mode == "xts") {
        if (enc) {
            typename XTS_Mode<BC>::Encryption x(k, key.size(), iv);
            x.ProcessData(o, in, sector.size());
        } else {
            typename XTS_Mode<BC>::Decryption x(k, key.size(), iv);
            x.ProcessData(o, in, sector.size());
        }
    } else if (mode == "cbc") {
        if (enc) {
            typename CBC_Mode<BC>::Encryption c(k, key.size(), iv);
            c.ProcessData(o, in, sector.size());
        } else {
            typename CBC_Mode<BC>::Decryption c(k, key.size(), iv);
            c.ProcessData(o, in, sector.size());
        }
    } else if (mode == "ecb") {
        if (enc) {
            typename ECB_Mode<BC>::Encryption c(k, key.size());
            c.ProcessData(o, in, sector.size());
        } else {
            typename ECB_Mode<BC>::Decryption c(k, key.size());
            c.ProcessData(o, in, sector.size());
        }
    } else {
        throw std::runtime_error("unsupported mode " + mode);
    }
    return out;
}

static std::string dispatch(const std::string &cipher, const std::string &mode, const std::string &ivgen,
                            const std::string &key, const std::string &sector, unsigned long long n,
                            bool enc) {
    if (cipher == "aes") return sector_op<AES>(mode, ivgen, key, sector, n, enc);
    if (cipher == "lea") return sector_op<LEA>(mode, ivgen, key, sector, n, enc);
    if (cipher == "serpent") return sector_op<Serpent>(mode, ivgen, key, sector, n, enc);
    if (cipher == "twofish") return sector_op<Twofish>(mode, ivgen, key, sector, n, enc);
    if (cipher == "camellia") return sector_op<Camellia>(mode, ivgen, key, sector, n, enc);
    if (cipher == "aria") return sector_op<ARIA>(mode, ivgen, key, sector, n, enc);
    if (cipher == "sm4") return sector_op<SM4>(mode, ivgen, key, sector, n, enc);
    if (cipher == "cast6") return sector_op<CAST256>(mode, ivgen, key, sector, n, enc);
    throw std::runtime_error("unsupported cipher " + cipher);
}

int main() {
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream is(line);
        std::string spec, keyh, dir, datah;
        size_t ss;
        unsigned long long first;
        is >> spec >> keyh >> ss >> first >> dir >> datah;
        std::string cipher = spec.substr(0, spec.find('-'));
        std::string rest = spec.substr(spec.find('-') + 1);
        std::string mode = rest.substr(0, rest.find('-'));
        std::string ivgen = rest.find('-') == std::string::npos ? "" : rest.substr(rest.find('-') + 1);
        std::string key = from_hex(keyh), data = from_hex(datah), out;
        bool enc = dir == "encrypt";
        for (size_t i = 0; i < data.size(); i += ss) {
            unsigned long long n = (first + i / ss) * (ss / 512);
            out += dispatch(cipher, mode, ivgen, key, data.substr(i, ss), n, enc);
        }
        std::cout << to_hex(out) << std::endl;
    }
    return 0;
}
