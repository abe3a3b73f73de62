"""Codebooks of the i-quant types: the lattice points of ggml-common.h
(iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid), which are
part of the file format. Stored zlib-compressed, one byte per grid element."""

from __future__ import annotations

import base64
import zlib

import numpy as np

_PACKED = {
    "iq2xxs": (256, 8, (
        "eNqFVVuS5CAM++UKOoPuf78ZLMmYLLXT1SkSYvyQZGct/egVuDfoFQtPA34M6RXLB74HqRW/N9rm5ZBZmWc5hK+v"
        "Y+ATII55Oz4Xc1+OMZ2PANgWtccrIBOYqYzwEdoH7cfP5EyQSZRJmNpHlbLNMZHCBghKgy/kfh/pOLPgxOgrwUkX"
        "oRKrCjo7OpsJlGOXAY+LMhvQfIGM8/OST2CBvwAWw4JlAk5ZIEC/AZZ7Gz0A54Z5AJ4rkTr1hYuAijSIEEdlXMqr"
        "yIOQ7paoHJEMMaVPr5LNJGRq90isoTxEVbGC6xCHFaiptZQ2CXVH7Jcidiuqkf2HaGMR8XTsdXUBrOaA1wwdgeAj"
        "FOca+ZsFwOu65FtxRlUllEtQfAsLlCKiobobAotS+sSnwyXK0elKQHnT7Wo7wXjB2T3XGr/hOQJmhKxuiaqLvuNe"
        "OMKh91qGAl9aAOZkESSOW4KnIS9sJL3/NQJ5NYRiUX9pGrNBgEysAb4ahXruSTY/O/mcdAJRbDOSXlzd1WuOymbM"
        "ktGQnRrkNQF7LBgFz106e/rDkjZmRpFm1KMx3WvRuqemoa19esbHuBgw7VKggELYclb7VH91Xf5hzoD21KEk6Cpb"
        "kT/vBJbU"
    )),
    "iq2xs": (512, 8, (
        "eNp1V9GV5DAI+3ULqkH99zcTkDA48e7LcZtJbBCS8KyVP1QE5g0qYmE8QEVwvkBFYC6ApQW0EBX/j42FqQjMjbD4"
        "uSEV/0+NBLAwEvm/NhKCLidGxeepnigVn3R64lTE4mchVHxe64Vh4btAUp+r0EvBvp6HOwBY+AQCS0AcgDzbd0D+"
        "/5ANk9WT8SINMCpGFQ3A2P0DSCoGjA1YLAyAeQDtrW5AGwtfBh4Lnw1wymcjkDtXQ1zS2ZCHRr0xdIMQlKhGuTfO"
        "yRcVDcrZyOgKN5SvxvJkOpnrZjT0t8arhBVlDEVwEOG/DXU/IoaKUZiAkzBuFjAJhMHGTSSXCkxiYXRrE4wkOqVu"
        "hDN0wCSgf08i+s6LkEVERKSi33TKvBKVg7BupblpDjiDk8jOyMXEYp3Ykc4muDO/Er0IHrXEemyVnsTnKQDEi/lR"
        "E4JTIQohhEc+9GnCMHWd8urcK7d9C8dIX4WTrK0OXAXEjMAUkn9PQbmTp7BAfgosEYo3IyIBKSYwMXouDgF2E+Y2"
        "i2hafs7MzAINhWqyUY9TWO4K8k+9xc3ENYeLh0EJ3JVjjt9i8Cl8I4Q5FqEti/GnMUDuiTnGXkbhm5hjppRzGgjm"
        "GHgZCcTm7MhW3GksVMS01zIao4Fpc6VcZ4FpW5Xb3ZCm0l8GhSH3R2tdxkkJrd0NDFNmrwkLqHdImbBMYNWW6Bkm"
        "3UPsur8azUoZmPSp1F9GSA4HuxkjJswFdq68DZLnCUDIMdVQzngaJ+Y2ydcsY4uyGyurSupvov1nZYOQE6wZMXzo"
        "yeFiY0aahDxU9VD1fCx0NXDlTp9e0gQ13Zuxh2eFlehoEIwvl6ANvsic2o0KkIwD9lk2TD8SpMi5cnYDcj49M79m"
        "+GtFDQoXdg4MH05c8G1w2FltjnqxALICeBkwG0AcA4dj8LD26q67AT4Hkzauzm/30DEjh88eXFJkCi1nbyBM97QG"
        "2UrKOYt8etUE8ajTMLEJerwsf5JRTKGQK0LcBqMKYtmnbDLLqdNGMSP33gPUTC+HsYxTK0nQvB9LUDHZKYtjMC4o"
        "lmJHSXDpQ9OOa4/8RqtqLTlbrDbUirFaO0GbbKtIwPNkvb9qoQkkksycQxnuRD/csy2hiV5Xop9H0TxyEW3w67E6"
        "kfnnB+/mPr4="
    )),
    "iq2s": (1024, 8, (
        "eNqFmWF25DAIg//6CjoD979fG5sPI2bS7r48tttJYoOQhGet8ycySv4fkVFL9oHIqPAbIqPkD9DKB+SDIuPvx+zB"
        "kVHyF2mFvTAyKnwBkfH3LluQlr4u7PfHc1/kz3mx4Mj43NU3EBmfZfYNacXXjUXG5+N9o1qyDUdGhSdAykRE/rwy"
        "ISMxkVHKuOJrorieh/XEaelrAp/0RKalJzQyPtvtCX620RP9PO48xxMf6yRePflsjpe1gkTGnZ1WoL3aVqjIuN/S"
        "ChcZd9laISOjlqywkXGnvxU6Mu40t6UBgMiocEDstJx151Yi7wsDDLXhAkCRUUsGqMi4l9MAtl+nk3i11AG8yLg/"
        "1oAYGSUHplZ8BWhklBKwkT8vfQUwpaPWXAoHtuQAlxzoWnLAJzPsVP3RAGCe3HIBktU3Ffny1igb3XH6IqGn3kCR"
        "cVe5NVRk3NmMzF7kbiN32Rpv/zayrSJ5qkF9NmRk3LBtDbrh2Bp0wyUSJpFwsMYN9VbaC2sNrSVr7FhhDR6j0Z+7"
        "eysuIy/VHpaxqAqsgEXGQsrFXYKgFJIThgz9oBh0XiKJ1VEFii51LKvWJRzJiUeZpUlAQERyQiKn/IWgIuOhmUtY"
        "kfHQySUw7iQFkfHQwCW2yHja+xIdb5yEB6RPO14CZGUQISsk9WCSmh7Y3x1MgjywvTuDMNnhG2HSYnAiPUxGVicn"
        "SKQRK00BwZLB1Tddi7vEGxlPGi8Rk/lJyFAAt5403ApNwqZiq3Ehvd2JnNxyQexUehI8FMTSIXwQMYkfhLwJAFuH"
        "M0HSFASQ9SYMD7915NGaoWY2mnCwVy6QunqTxi3JTlRD8hWYMGQXFTRKVispmkAHTGGiI6ZAPSp0nhd/CtWT3C5Y"
        "SAJQQovouNVFt1zgFTbIPtJ10aFT8AAloJjCd9TnCmCkANLhUwjp9cLickFE4qollr4KJJbqTShLg/LvWWikb42U"
        "mC6k+Yna0vkkTAS1h5q5bYJLT2FaEPu67hsv+TaBhkymUJ/kd8F2Zw1FUAKYcgo6zDmFPXbbXoHHil6hlwm+Nlyv"
        "8Bc1rWZGGzNPY3CTfH6AuUsadzridEf3DmAV43AfsaN8LGUMZegog0FF5WMkvVXKsdzklBEBCfLxDvEpxVlOipBa"
        "GReQVGTg41YZGopFMUhmJcvHopIGWk8+xqDic0xBdVVY8bGiqE4+NhTy5eNAKes0VHQIbAu7yu17GS25Da+t0WHS"
        "MGAyO1zSSBfJ7W0ZNLmNLYMGGuR2s6Aqt5OlZXKbWJ0vt4OV4+W2rlp5uV3DnpURlNuuMoQwy7BX006VUZTbo5Iw"
        "uf0pppLbmuLsaSypgdx+1COm4dxq35zTmwGFIeUyX0uaxlQuz60FNtC2unZnRibl8liMjEfCQ+DkpsEFe0Puprzd"
        "E4IXIwzzy+WlUl7FyUXK5eDjpCFpfNL3q6FGceQ0WaVeTnOT1kpr5TRWXLKcliYN1Zbk9FKmbRp4FBHzgLWQ00CR"
        "9fK2LZJY3o4FWkAmb6tKBi+Rt0ddc0CQw/djUJDDrFppDg5yWFTuHoHrg4S8fGVJ5WUp6MjTXZ5sDh6wnDw9tec5"
        "kMi38zGYgBr5a4s65sAi//XH4MI/5gATW5E/BxmcETdiQXnAHHR44Bx4zjBzTTkv+m8A2q72vD/6QMQCl51+3wGJ"
        "VmfhzDRsYA5ObAguYmPvA5WfzGFSSACiTCLmwEVi3gYv7S19HcCaa82EtMGMxDISkOA5qJHwt4GNQrwNblhUigSl"
        "VjVOx1UhS2nS2nDvTl0b9LaXjeNJesGXf/3C1y01CAIEKIOlMKsVkpd9XVGDItwAYMAqNeGaAEIhARJKiblafpxe"
        "QKO0AK7Ey4+1C4iQHICk6bkKXFnkI+d3UKVD83i2gAylAuhS8NQQAL76SN4Av7pktgYAsjTC8mO9agw0nwYpLswl"
        "src7KPsJMmpKQ6F2NFZJRG6VRnsbrCObiuLPQVun2z4G7kLNsmODatzaba6SSZCGLseTZmGTYBsXD4ceDvQj5TAC"
        "wDExvi0fz4og3gZ5JlGIg5VBIHPQB3NvA/8kGqQZwpmDf9rfIqK3AwCYYvUvLa/9qkxCYPOgAEJ7OzA4hwGX8P47"
        "QIAIIZs4m9+02IlxHjDESWXNuDrVrOE7V1EnAkmLdQABwfKtLXRW31LmlxAQ7zyoKCgdZihzelIZ9ztJjhxWPyWK"
        "PCXi5nm6cf8Jwb8deBykxb2yrCUlmYaoL1/rjOq8XmeEyR6tI6z6mK+2LS0/ln9+AIHIjsQ="
    )),
    "iq3xxs": (256, 4, (
        "eNpFkzEOQzEIQxdGRkZGRkZm7n+sPpMv9UdW0jQBYxwzswAF3M0SrL/NAJ7M/Jlr1sAZCXQ4gIdbx7sYwMut+h9E"
        "o4D7CxjAMyzBAm9m0BsXeYGSBuhgvUnoYiqrYu6CS3G+ON+cb/KCbuscqxnurxUYkLXms8c4H31RFh3RuGJI4wW+"
        "kFecGOtTkRFvIVa6raFNS1b7io9PAM/0KTCsYdHAGkR7gUEc32Z/CIFI9YSSOv4kPNEk1cRLiv6XWFShd2KKgYZS"
        "J6EWoPmJrOt+0Z/g+tCaRgQyPeKqvvw1oUBnISNA9Q06Ws2+OrvsbaBldL1i7Sp/RauVaJY97H3Ni6+BGkWSASqN"
        "zVMbCiQE+wTTR6Noa7FHJ66TDePObpj5pEYiaiaGGLnhlKtOZoAFoItFFrPElYRhwASW4DcJuqDDEW+cNEWF2ukz"
        "FU4qOSDkgtRsNOwzGC4dIRw63PZj/4SidA0cBOHCxoTdkqPbU6YcVN0Ts8LIajOgRgbw0aBP/A4UvApH7HSRZr2i"
        "ba/Deg2QWZ6hDP0aA0N4neHlRiUTM71YCKwEs0lSSJm6V6zXhheRZPYHxKhj+Q=="
    )),
    "iq3s": (512, 4, (
        "eNpFlYuKxTAIRAkiIiL+/9/uGe1yKUPaNPU1o33vPQMOCsy7DQMOEvR3wECBCJ6TLVBggPFxyECzDwxDCeYzqMtB"
        "fsYN1OckwAAL9kDi1HBawOec6+sC8wUSoIE5+66g/CXw5BkMMIINBTysApdZ4JcEPJ4DI5kADTLZL/bBNO+Gs3PJ"
        "huUbYCSdwIOkk31gXxEUYaqKTqSgQVAUyyKm4gh7zd6wcpk1dlmj+YR1ehlQlikmnHvQIILnYr+uoHZ0WH7FtSuf"
        "FZiv2JRF6RppmdLBveFebg2TS4TdEW2tlQTm3Af7cRsiykXWcG6ONF0FBhCkJXARmW4Bqrhv9uaMqYJksVHq4rAN"
        "IDHi4zlhtHke3qI6Konl3AuDxMIzwmiJo9itC0wZh12AkI1Z7ot7b2JqfLBm811vAjC7FVLkBGcVrMkziSHWFZut"
        "OsSiGDjxKctcq0qe9wBJSVSSEaGuJLxOBqLfoXMFC3Ven3BFy9vs5Z1nrJWKSfoqgedXWEzksq8TuABo3Ceu2Oja"
        "B5Cg51wD6ECpmyz2ixQhEY6+OUTEFd59JKGkbRadInAkD2nJPY1TI4UTFQ1EIvikibLwyTpqqMZXrzIpnFexttQu"
        "sqm4X8MFgaHZDc6WaTHEG7tg7VovaDfC2FaKkVDUNv0TjLoU2YaUYJvRSoSmJVEo7bmGlgLFhi7SpXlPYG/Vg/ut"
        "RCiy9SzhcRCfdGlxPwonV4yoZotmslR0UGck0IRCc/gqqsJK9JkVLQPDSqdZnpDRGvHMsobOdpBoaogA1EC1nyoE"
        "CWSTOzrU9ppcjM5txQ1GjKuFShGrIYp7IEmGpjDSQTIp9UTcgIIm5M/9+E4pNZGSkUpFuEpCxDvEFAqf5IgBbm1y"
        "J9ao0UjemwKo86KTAYY/JpnNsgXHxKNpS/TbmTuOdxBijTc8Y6z7DKphVcDSdLZVulgqtaJaTo0cvjIupLpF1hSf"
        "txJATYFdZMQbDqis2GQaAEqBrSwiLU0gKZNFJ6lGr3hTAqZz0KNIaj5uu/HfezEi6eZGyRoZK3AU0KomVloXNeUc"
        "xUB6aKqRTMsB5eNt8o7IAGFisVpT/2UzgPirfEM+79e4w5566XezQ1+/ifWgIcUHiAVajMA11l1/mdH0bo0PjQd1"
        "QP03nBQYKzZqwl8GSiUlXyrxQ/n4gdC72zUK4Q/ZMDHN"
    )),
    "iq1s": (2048, 8, (
        "eNp1W4tWJEsII///0ew6lQTC6J7rxdaeflRBCAG73z/QVuUPQFtd/H2egHMiaIsfKF2RHwRtFeJCOBcE7f/T4wY4"
        "N4Jv+Pnvc7fi89Z6END+3PZzTPtz+eLH33nP/vz4c8wHr3oWfIH6XPFd8H2OxwDPb/A5sF8YtP9NLADOQoD25257"
        "YXAWCLQ/rweuN/hY4PO9Y8RC4iwoaH8uw/uC14kFx1l40NbZANB+noLffv4H2nobgrMxJfvOfI//fo59C22YvuDv"
        "KzYStJ+PL0/8nPb5fdsj3yNXbHjRQseo8GTQViEcBLSzFM9BqtJhQFt2HPC8Z6FjpGP9LBO4rr85GmirjuN9bvz8"
        "F+/67xi0nwehHyxH/fjBclgcx5VTcVF8Eo5Dg/az6yA+gKsJPv1yeBzHB+0HF1Yg4AQEaN/aEQ9WoHzcDAx0EAcw"
        "LivkKdnSMSLAPtsDLj+4/OByv/uA148AxAlEfX2WYQUmToCCthio9SLjPQ6fD1zHHbha+s/lVyAD+nlFYOMEOBTo"
        "ga7lYJQTHhRy6F+AqBsd4c0l76UXavcGULzqHavgp+u4atkH9OygfTD0AGT/RkD1YKceXry7CbBqXwG0AraihY5R"
        "kYkeDDAQ3+fBz/FJmKEK8WQvXF72AdcZzHTgxUD0BJ8LfB5wvUG02QAL2ud+8+YCXtA+N5ncSoxwbPUG1wXMAhcG"
        "eTMouE1c3OJiPAxZDzM7IIAvWugYPCbwv2XcCaDB50Rk+Hq2aD8PVozmB4bYO69EUrJ4Vrlaj6hYlodoTfQFfQ/+"
        "nh4EeVIhEhSQHtazBFVct+15OAmsaKFjJjQgPVUJrmihY2TiE2T3bEEkRCgx2vMrEmXRQsfgMTKRgvblw4kgQQdz"
        "c8PHjA1+Nfg97fOQ53+bwUFMblyJCZq/p3XkMpFDCR38uawS/Huxh8cr4RctZEkAAFoSgaokAD8GC7P0jvWSjhFF"
        "4IdaoIAhEHKajpuTOGE+LKIB2gKtQu0TUYwjMC4WIUGPjxeIahvxCjxvIL9WCIvICBlFaIoWOgaPkYSn3oY8PgY+"
        "LZ+bzwdeLwgRPfHxr/feEGfA8qnPBUF/WilLS1VIIgXaKhIr8Pjd6d2eHyZ0gRkAvO+zeLajChtiJg4hbOmoHsD8"
        "PMRNpICsfEBYQdCbVQ7BwyF6YmOPLQ3xE5t5eXqIoNiGIbonR0xWVBYTpRviSJQ26nWgxmRKRTmjltEJRgMJ3cOG"
        "5RWYXTuEVG9FRDF2a41xCCtonYKYuUEi++gkSB9fpt5LCtqXl8H6bAgvDvEFrVKdiDCxhPmYfrAIck1ID4moeXIm"
        "A4ItwcpBhdmUQ6xfPgXzKP1gn6Kcp70GgogrRcu1xGhEzEv2AYJX9qUXMJ2AS7AJ/LNF+xwDhOlhSiL6oH1wPJSB"
        "zJseR0zj+mIzLS1FsUAw86KFCoZHPRjqruAfLEwhgVNQqFYQd+hdNK1CQ+Tf1KYXaQHjfBUiOAUJTmGCU6CAlktn"
        "RqnChZjqvVbqkGvIw9+2DgNVoQPatx2M46VYgAXQq7+4f2A8r8IIp0DSK/SK2V0o6cvUj4wYLKDeYzGOV0GFU1hp"
        "id7HptDCKbhAa+2it+pkecwyliK+UqaqP2QpJr0p2FzFdsg/1VHtTYmFI/MceedUOapmVMV8yzsVbN2yjSuKTllG"
        "cozkl5LsUimrSD5xRdK/yyhGRrGNZlbPbG+Z48oY5pKUJyw/CGmFWkc2kDzwoGcVtCzLy2JqZXlsESDL11u2+oxT"
        "jrriEuKf8rNEPkQKkGWnt1ygL3DuDSqrbDzloksjQUNluVenvDM3FFdRblBM1inMT5nlVNNZPnllTnnkAt5lUUc5"
        "U6d8cZkCF/pRlqj88CudcsLlQ2WZoDKARHbKAEudtwxImu9a4A/6LtpuJVYSWR263knPS/T80HDRbjODSlo9lblK"
        "Asjjgh5f+lukvVMyyxVEV0VTyRXQQR8NPZX0UDTQHn7pn0vzpG9ftM3JS2B86BYIBla4k1a5Vjs0aujToUtKoQqF"
        "Q48uLRIdshBEOiT6U6I9ojeXxhz6UtQ5TV+kmJCuFOnKq1pWLd2/04Cb7p3emYmUvo0oTJ83PZ4u01eatMiv2qyy"
        "i6Luh0XOyrRlqOlMR3XSj4tWpQ2c9CASa0EsVGCpuJMGBP+9tenvNGAQrVAbR2CrI7TJaY4KaNiuhOc6cGwf7IRd"
        "u2onvF44rQOfVsg64bEOHAruRgLrgKc6cCQYGvghzODAiqvdDrj4Cw6c4xXOorJ1BMYThq4+GF4KK7Pw/j086oTD"
        "yoDh3k51nW5q9+xgO27CuLbq393PGbbSnYw9x23sA51uUGe762yvtxW5vXW201njCqkqJSq3o87y32Wvr+Um2mhZ"
        "kctbdZaxcrnqLI9DovK167yOk1XnY/txKx+rzu29S+fyduo6QnHlj/1p/cMRkvUDIDulOqErT8QRnvVBnAt0nQuB"
        "Uh9SqK4jWOtGOAL2vXFXPgDOg0joppLISp10g/u8hfBCPnhXvkAvrXIL5bU0IDHH/cLUqS2o/7UA4l69cj3oHlt4"
        "r4U9G3q1cDjCvBYSZ0G7zsJSuJfSUiPFhpBPyYh873sjwI1AIzYEtA3+nFYNgdo97rVhahTUaRRo416tPRvXu9m1"
        "NrIrNxSn0VCn4QCJ85Ubj84N76FgsfF9Nx7ZUZGCJUeQNFKngVG7qNiOUukYXekgOI7SG6wXZexKB8JpjOgLx7G6"
        "0sFwHa3depJjheN1pQPqEtTv39FyTM+aHAeFeh/HQfGHo6oxU7Jd4cB6hV7vvJVDIQ2FvEeL18gI6Pii4AoAnvpU"
        "LjBOIiB6TS/BQyY3INw46orA0JJ3TJ1MwHRMi2CaF085s3hKfd/iU69Zk+nak2X+EnhWUOuPQMTvAYkbmNsZtGir"
        "EgYDFDdAe3dh3G1x6a7ugboFHao6XPPWcllsTLiB3VvNXIEe6tgEunuKqOhcathEQNBLW9rA0KuW2kDRlYCBAxwQ"
        "ltEX0AhAaWeeXRWPpKbSsaMadbXprcgqEa4SLa5GFTWzLhfAcICsKwEMB8g6WNhwzAry8A1wXQl0OIAHOeVI0r8C"
        "IA4QQrYRwEjUcENTHQS3LsqTXfR+emV42Wi/dRqhksy1il0JtPlW8FP1Ad6n84CNfJAXTIsfsBLEMysarlqCbkQD"
        "FrLQMYEd5R6PNF8PbyzAF/a66Y3DUE5DV08qEd0ids9MxE4MvXo4Fi9WA9ijfX7zbAyr+OlNqjGpTK7QJ8E4KRC8"
        "1VDGH4mnh2llIuo1k0CxEEtDlxKnBNVdkah6XWordmZw0A62Sm7wc+DnsHe4cwzZjW6chjdO41u9FzHEM97rxriG"
        "TW7C7BzDdeNcLaM6DXScRrqaOmagvUTrGXulKKqprEnMEmfUYuwcV3XiRsUYqhN553jpd0JHNvQVQTfBd453ugWu"
        "lpmYdOd4pnuG6n1Jq5EyO4QBMSiAMzCgllydwQGcAQKcQQITjo5xP3UPTDzk8mcMzzEkCciEpEOtc5NDBMWidU1P"
        "co2HwapLxbiXNazOMS0jl6Adh+gIUzvI4Ez2dI4/aezJrSol2zqDEQILLY4Q0+NAYjUdYz4mVMixniFYOY7jSzpr"
        "KAvomdmyIGoJdTwhrKjvHGNxid05luIetryHvcYheF0x0PFF+N7djQk4Ax9qGavC6xzf8Blq9tZuKq6WTN/xClWI"
        "Pb03fm7EwzUZjR7NxMX0IqJtTtLYJY8pA8cNOscK/EYKQhHZzrEAH6jXbaKb7X2XWJ3td6+UvkSMO9vnXkm1yz3S"
        "19H2NlU39VEF3dGW/iLcne1jE29cAp5tXg+N/EXMO6ebTdQ1iFNnEEepV6HWu8myCL2aGCL2ne1Pi4kVU51DBbVV"
        "4qidbUOT8sr2nif7OqfXYBKgpNQxtTXUk07Z+yKrcOhsd7mAUGSIcd0CorONBAq5/lOJzjaQZ8xVaCji3J3vaIu4"
        "19DZ1jDD62xbOBVWdF2nUOlsM/gdOtsGjngP6yAHpqTYdMr37hqpIOqU4c1ATf0bWSilHO7CqVPGNoOVXN0pP1tc"
        "75SVzXg7VVtTTKWSTpnXDNlct7cqNwNhlbKo17RSfXIxc2RNQ1alTAkgJ09N6jpUCRwZEPijMOzVW92TrOioQv0w"
        "t4DUABsf3INswnrICqtSvnIHWKydeqv/dkms0qxRrK43e5reptiQ2AwqZBlrAMMSesspltCcpVjZdMoh/pubTpnD"
        "hW4nKnFIYArgThTxTJTkBkVzR9RNodwpF7jykldpt+uU+TiFtDlnluX2TRXDLqcryuFFDhEdeYGzQFPgpiDqr0I8"
        "C/BeMbErx86yzMxB5ZjKrc4yysxCZZPLo45yxxKp3rCzDDEzEUdQzHaWEWYuKhuWUDBDT2swUhWxhlcgmzR/Rllq"
        "//WD6bgprVKTBIhOumxxx3T4DGDCg5gk/Y+OmjJ10sslaAQNHM8gJHTSOl9MXEvY10nLfIpomP+YUDSo9zTaHgAN"
        "+mGGqOkm044cvkcnvbDwctI0Tpq24KK0K1dWF11p8gownWnJSscVZJQGVDu3OwBbRJ4Ik6gpGBemuVjvgEdLJC5C"
        "CIudcAaTnA74wYEfgjV44/mTgj7CkHKAMYalGPfEX53hbkaPM2CLM2ircFT13Bk2RqBO93eFIHdXLu50W3/JTcXm"
        "NTJh92r8KmyJPWn7le21ragUvLo3mo8YhTMIjDMQjDMYrMeWQNZ5e68uzuCwPq7TO3/ss/TvHzM5DA8="
    )),
}


def grid(name: str) -> np.ndarray:
    """The codebook `name` as float32 of shape (entries, width)."""
    rows, width, blob = _PACKED[name]
    dtype = np.int8 if name == "iq1s" else np.uint8
    raw = np.frombuffer(zlib.decompress(base64.b64decode("".join(blob))), dtype=dtype)
    return raw.reshape(rows, width).astype(np.float32)
