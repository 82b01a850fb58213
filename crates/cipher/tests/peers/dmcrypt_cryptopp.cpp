// Independent dm-crypt sector encryption with Crypto++ (libcrypto++-dev), for LEA and AES.
//
// Reads jobs from stdin, one per line:  SPEC KEY_HEX SECTOR_SIZE FIRST_SECTOR DIRECTION DATA_HEX
// and prints the result as hex. SPEC is {lea,aes}-{xts-plain64,cbc-essiv:sha256,cbc-plain64,ecb}.
// IVs count 512-byte units (LUKS2); ESSIV = E_{SHA-256(key)}(sector, little endian), the ESSIV
// cipher being the same block cipher with a 256-bit key.
#include <cryptopp/aes.h>
#include <cryptopp/hex.h>
#include <cryptopp/lea.h>
#include <cryptopp/modes.h>
#include <cryptopp/sha.h>
#include <cryptopp/xts.h>

#include <iostream>
#include <sstream>
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

template <class BC>
static std::string sector_op(const std::string &mode, const std::string &ivgen, const std::string &key,
                             const std::string &sector, unsigned long long n, bool enc) {
    byte iv[16] = {0};
    for (int i = 0; i < 8; i++) iv[i] = (byte)(n >> (8 * i));
    std::string out(sector.size(), '\0');
    const byte *in = (const byte *)sector.data();
    byte *o = (byte *)&out[0];
    if (mode == "xts") {
        if (enc) {
            typename XTS_Mode<BC>::Encryption x((const byte *)key.data(), key.size(), iv);
            x.ProcessData(o, in, sector.size());
        } else {
            typename XTS_Mode<BC>::Decryption x((const byte *)key.data(), key.size(), iv);
            x.ProcessData(o, in, sector.size());
        }
    } else if (mode == "cbc") {
        if (ivgen == "essiv:sha256") {
            byte salt[32];
            SHA256().CalculateDigest(salt, (const byte *)key.data(), key.size());
            typename ECB_Mode<BC>::Encryption e(salt, sizeof salt);
            e.ProcessData(iv, iv, 16);
        } else if (ivgen != "plain64") {
            throw std::runtime_error("unsupported IV generator");
        }
        if (enc) {
            typename CBC_Mode<BC>::Encryption c((const byte *)key.data(), key.size(), iv);
            c.ProcessData(o, in, sector.size());
        } else {
            typename CBC_Mode<BC>::Decryption c((const byte *)key.data(), key.size(), iv);
            c.ProcessData(o, in, sector.size());
        }
    } else if (mode == "ecb") {
        if (enc) {
            typename ECB_Mode<BC>::Encryption c((const byte *)key.data(), key.size());
            c.ProcessData(o, in, sector.size());
        } else {
            typename ECB_Mode<BC>::Decryption c((const byte *)key.data(), key.size());
            c.ProcessData(o, in, sector.size());
        }
    } else {
        throw std::runtime_error("unsupported mode");
    }
    return out;
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
            std::string sector = data.substr(i, ss);
            out += cipher == "lea" ? sector_op<LEA>(mode, ivgen, key, sector, n, enc)
                                   : sector_op<AES>(mode, ivgen, key, sector, n, enc);
        }
        std::cout << to_hex(out) << std::endl;
    }
    return 0;
}
