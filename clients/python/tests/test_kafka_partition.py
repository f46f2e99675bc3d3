"""The Kafka partition of a key: the Java client's murmur2 (its own test
vectors, Kafka's UtilsTest), no broker needed."""
from idem_pg.kafka import config_of, murmur2, partition_for

JAVA = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107}


def test_murmur2_is_the_java_clients():
    assert {k: murmur2(k) for k in JAVA} == JAVA


def test_partition_is_the_positive_hash_modulo():
    assert partition_for("foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12
    assert partition_for(b"foobar", 12) == partition_for("foobar", 12)


def test_a_kafka_url_gives_librdkafka_settings():
    assert config_of("kafka://a:9092,b:9092?security.protocol=SSL") == {
        "bootstrap.servers": "a:9092,b:9092", "security.protocol": "SSL"}
